"""SamplingParams (what a request asks for) and sample_tokens() (logits -> next tokens)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

import numba
import numpy as np

from . import checks
from .kernels.cpu.sampling import row_weights, sample_rows
from .kernels.cpu.token_mask import mask_rows
from .structured.params import StructuredOutputs

MAX_LOGPROBS = 20  # top alternatives per position at most (OpenAI's and vLLM's limit)
GREEDY_TEMPERATURE = 1e-5  # temperatures below this sample greedily (vLLM's epsilon)
MAX_INDEX = 2**31 - 1  # token ids, counts and top_k at most: what the kernels' integers hold


@dataclass(slots=True)
class SamplingParams:
    """What a request asks for. Where vLLM says "off" with -1 or None (top_k=-1,
    max_tokens=None, seed=None; None for stop, stop_token_ids, logit_bias and
    bad_words), so does this."""
    max_tokens: int | None = 64  # None = up to the model's context
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 or -1 = no top-k cut
    top_p: float = 1.0  # 1 = no nucleus cut
    min_p: float = 0.0  # drop tokens below min_p * p(most likely); 0 = off
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in prompt or output
    seed: int | None = None  # None = fresh randomness each request
    n: int = 1  # samples per prompt; they share the prompt's KV blocks
    stop: list[str] = field(default_factory=list)  # strings that end the text
    include_stop_str_in_output: bool = False  # keep the stop string that ended the text
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0  # before this many tokens, EOS, stop tokens and stop strings do not end
    presence_penalty: float = 0.0  # OpenAI: subtracted once from every token already generated
    frequency_penalty: float = 0.0  # OpenAI: subtracted once per time a token was generated
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    logprobs: int | None = None  # per generated token: its logprob and the top k; None = off
    prompt_logprobs: int | None = None  # the same for every prompt token; None = off
    # the output must match a JSON schema, regex, choice or grammar (structured/); None = free
    structured_outputs: StructuredOutputs | None = None
    skip_special_tokens: bool = True  # False: the text shows special tokens (<|im_end|>, ...)
    allowed_token_ids: list[int] | None = None  # only these may be sampled; None = any
    bad_words: list[str] = field(default_factory=list)  # words never generated (vLLM's rule)

    def __post_init__(self):
        """Check every field (TypeError: wrong type, ValueError: out of range) and keep
        each in its plain type, in containers of its own (see checked())."""
        self.max_tokens = checks.optional_integer("max_tokens", self.max_tokens, 1, MAX_INDEX)
        self.temperature = checks.number("temperature", self.temperature, 0)
        self.top_k = max(checks.integer("top_k", self.top_k, -1, MAX_INDEX), 0)
        self.top_p = checks.number("top_p", self.top_p, maximum=1, above=0)
        self.min_p = checks.number("min_p", self.min_p, 0, 1)
        self.repetition_penalty = checks.number("repetition_penalty", self.repetition_penalty,
                                                above=0)
        self.seed = checks.optional_integer("seed", self.seed, 0)
        self.n = checks.integer("n", self.n, 1, MAX_INDEX)
        self.stop = _stop_strings(self.stop if self.stop is not None else [])
        self.stop_token_ids = _token_list("stop_token_ids", self.stop_token_ids) or []
        self.logit_bias = {} if self.logit_bias is None else self.logit_bias
        self.bad_words = [] if self.bad_words is None else self.bad_words
        self.ignore_eos = checks.boolean("ignore_eos", self.ignore_eos)
        self.include_stop_str_in_output = checks.boolean("include_stop_str_in_output",
                                                         self.include_stop_str_in_output)
        self.min_tokens = checks.integer("min_tokens", self.min_tokens, 0, MAX_INDEX)
        self.skip_special_tokens = checks.boolean("skip_special_tokens", self.skip_special_tokens)
        self.allowed_token_ids = _token_list("allowed_token_ids", self.allowed_token_ids)
        if self.allowed_token_ids == []:
            raise ValueError("allowed_token_ids is empty: nothing could be sampled")
        if isinstance(self.bad_words, str) or not isinstance(self.bad_words, (list, tuple)):
            raise TypeError(f"bad_words must be a list of strings, got {checks.describe(self.bad_words)}")
        self.bad_words = [checks.text("bad_words item", w) for w in self.bad_words]
        if not all(w.strip() for w in self.bad_words):
            raise ValueError("bad_words items must not be empty")
        self.presence_penalty = checks.number("presence_penalty", self.presence_penalty, -2, 2)
        self.frequency_penalty = checks.number("frequency_penalty", self.frequency_penalty, -2, 2)
        if not isinstance(self.logit_bias, dict):
            raise TypeError(f"logit_bias must be a dict of token id -> bias, got "
                            f"{type(self.logit_bias).__name__}")
        self.logit_bias = {checks.integer("logit_bias token id", t, 0, MAX_INDEX):
                           checks.number(f"logit_bias[{t}]", b, -100, 100)
                           for t, b in self.logit_bias.items()}
        self.logprobs = checks.optional_integer("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        self.prompt_logprobs = checks.optional_integer("prompt_logprobs", self.prompt_logprobs,
                                                       0, MAX_LOGPROBS)
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputs(**self.structured_outputs)
        elif self.structured_outputs is not None and not isinstance(self.structured_outputs,
                                                                    StructuredOutputs):
            raise TypeError(f"structured_outputs must be a StructuredOutputs, got "
                            f"{checks.describe(self.structured_outputs)}")

    def checked(self) -> "SamplingParams":
        """A validated copy that owns its lists: what a request keeps, so that changing
        these params after submitting them changes nothing, and a field set to a bad
        value after construction is caught when the request is added."""
        return replace(self)

    @property
    def greedy(self) -> bool:
        """Temperatures below GREEDY_TEMPERATURE are greedy: dividing logits by them
        overflows, and their distribution is the argmax anyway (vLLM's rule)."""
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def adjusts_logits(self) -> bool:
        """Whether adjust_logits changes a row for these params (penalties, bias)."""
        return bool(self.repetition_penalty != 1.0 or self.presence_penalty or self.frequency_penalty
                    or self.logit_bias)


def _token_list(name: str, ids) -> list[int] | None:
    """A list of token ids of its own (None stays None)."""
    if ids is None:
        return None
    if not isinstance(ids, (list, tuple, set, np.ndarray)):
        raise TypeError(f"{name} must be a list of token ids, got {type(ids).__name__}")
    return [checks.integer(f"{name} item", t, 0, MAX_INDEX) for t in ids]


def _stop_strings(stop) -> list[str]:
    """stop as a list of non-empty strings (one string is a list of one)."""
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)):
        raise TypeError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
    stop = [checks.text("stop item", s) for s in stop]
    if not all(stop):
        raise ValueError("stop strings must not be empty")
    return stop


def apply_repetition_penalty(logits: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """CTRL-style: for tokens in `seen`, positive logits / penalty, negative ones * penalty."""
    out = logits.astype(np.float64)
    ids = np.unique(seen)
    out[ids] = np.where(out[ids] > 0, out[ids] / penalty, out[ids] * penalty)
    return out


def adjust_logits(logits: np.ndarray, params: SamplingParams, token_ids=(),
                  num_prompt_tokens: int = 0) -> np.ndarray:
    """Logits (V,) after the repetition penalty (over prompt and output), OpenAI's
    presence and frequency penalties (over the output only), then the logit bias.
    token_ids: prompt + output so far."""
    if params.repetition_penalty != 1.0 and len(token_ids):
        logits = apply_repetition_penalty(logits, np.asarray(token_ids), params.repetition_penalty)
    output = token_ids[num_prompt_tokens:]
    if (params.presence_penalty or params.frequency_penalty) and len(output):
        counts = np.bincount(np.asarray(output), minlength=len(logits))[:len(logits)]  # (V,)
        logits = (logits.astype(np.float64) - params.frequency_penalty * counts
                  - params.presence_penalty * (counts > 0))
    if params.logit_bias:
        logits = logits.astype(np.float64)
        ids = np.fromiter(params.logit_bias.keys(), dtype=np.int64)
        logits[ids] += np.fromiter(params.logit_bias.values(), dtype=np.float64)
    return logits


_scratch = threading.local()  # .weights: a thread's last weights buffer (sample_tokens)
SCRATCH_BYTES = 64 << 20  # kept between steps up to this size


def _scratch_rows(rows: int, columns: int) -> np.ndarray:
    """A (rows, columns) float32 buffer, this thread's from its last step where it is
    large enough: a new 6 MB array a step (32 rows of 49,152) cost its page faults
    every step, ~0.7 ms on this VM."""
    size = rows * columns
    kept = getattr(_scratch, "weights", None)
    if kept is not None and kept.size >= size:
        return kept[:size].reshape(rows, columns)
    fresh = np.empty(size, dtype=np.float32)
    if fresh.nbytes <= SCRATCH_BYTES:
        _scratch.weights = fresh
    return fresh.reshape(rows, columns)


def sample_tokens(logits: np.ndarray, params: list[SamplingParams], uniforms: list[float],
                  histories: list[tuple] | None = None,
                  masks: list[np.ndarray | None] | None = None) -> list[int]:
    """The next token of each row of logits (R, V), batched: penalties and bias
    (adjust_logits, only for rows that ask), then greedy rows take the argmax and
    the others draw with their uniform in [0, 1) (each row's own rng draws it, so a
    seed gives the same tokens whatever else is in the batch): temperature, then
    top-k, top-p and min-p without sorting the vocabulary (kernels/cpu/sampling.py).
    histories[r]: (token_ids, num_prompt_tokens) of row r, for the penalties.
    masks[r]: row r's allowed tokens as a bit mask (structured outputs), applied after
    the penalties (kernels/cpu/token_mask.py); None where a row is free."""
    rows = np.asarray(logits, dtype=np.float32)
    for r, p in enumerate(params):
        if p.adjusts_logits:
            token_ids, num_prompt = histories[r] if histories else ((), 0)
            rows = rows if rows is not logits else rows.copy()  # never change the caller's
            rows[r] = adjust_logits(rows[r], p, token_ids, num_prompt)
    tokens = [0] * len(params)
    greedy = [r for r, p in enumerate(params) if p.greedy]
    masks = masks if masks is not None else [None] * len(params)
    free = [r for r in greedy if masks[r] is None]
    if free:  # (rows[free] would copy: 33 MB at 32 rows of Gemma 3's 262,144 logits)
        best = np.argmax(rows if len(free) == len(rows) else rows[free], axis=1)
        for r, token in zip(free, best):
            tokens[r] = int(token)
    held = [r for r in greedy if masks[r] is not None]
    if held:  # a copy of just these rows, masked
        picked = rows[held]
        mask_rows(picked, np.arange(len(held)), np.stack([masks[r] for r in held]))
        for r, token in zip(held, np.argmax(picked, axis=1)):
            tokens[r] = int(token)
    drawn = [r for r, p in enumerate(params) if not p.greedy]
    if drawn:
        chosen = [params[r] for r in drawn]
        temperature = np.array([p.temperature for p in chosen], dtype=np.float32)
        source, which = rows, np.array(drawn, dtype=np.int64)
        held = [i for i, r in enumerate(drawn) if masks[r] is not None]
        if held:  # (a copy of the drawn rows, masked)
            source, which = rows[drawn], np.arange(len(drawn), dtype=np.int64)
            mask_rows(source, np.array(held, dtype=np.int64),
                      np.stack([masks[drawn[i]] for i in held]))
        # the largest logit over the temperature (max(x) / T is max(x / T): division by a
        # positive float is monotonic); NaN if a row holds one, inf if it holds inf
        best = source[which].max(axis=1) / temperature if len(which) < len(source) \
            else source.max(axis=1) / temperature
        if not np.isfinite(best).all():
            raise ValueError("the model's logits hold NaN or infinity, or a grammar allows no "
                             "token: nothing to sample from")
        threads = min(numba.get_num_threads(), len(drawn))
        weights = _scratch_rows(len(drawn), rows.shape[1])  # (the most likely token weighs 1)
        row_weights(source, which, temperature, best.astype(np.float32), weights, threads)
        out = np.empty(len(drawn), dtype=np.int64)
        sample_rows(weights, np.array([p.top_k for p in chosen], dtype=np.int64),
                    np.array([p.top_p for p in chosen], dtype=np.float64),
                    np.array([p.min_p for p in chosen], dtype=np.float32),
                    np.array([uniforms[r] for r in drawn], dtype=np.float64), out,
                    threads)
        for r, token in zip(drawn, out):
            tokens[r] = int(token)
    return tokens


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator,
           token_ids=(), num_prompt_tokens: int = 0) -> int:
    """The next token for one row of logits (V,): sample_tokens for a batch of one."""
    uniform = 0.0 if params.greedy else rng.random()
    return sample_tokens(logits[None, :], [params], [uniform], [(token_ids, num_prompt_tokens)])[0]

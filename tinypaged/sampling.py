"""SamplingParams (what a request asks for) and sample() (logits -> next token)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from . import checks

MAX_LOGPROBS = 20  # top alternatives per position at most (OpenAI's and vLLM's limit)
GREEDY_TEMPERATURE = 1e-5  # temperatures below this sample greedily (vLLM's epsilon)


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = no top-k cut
    top_p: float = 1.0  # 1 = no nucleus cut
    min_p: float = 0.0  # drop tokens below min_p * p(most likely); 0 = off
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in prompt or output
    seed: int | None = None  # None = fresh randomness each request
    n: int = 1  # samples per prompt; they share the prompt's KV blocks
    stop: list[str] = field(default_factory=list)  # strings that end the text (not included)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    presence_penalty: float = 0.0  # OpenAI: subtracted once from every token already generated
    frequency_penalty: float = 0.0  # OpenAI: subtracted once per time a token was generated
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    logprobs: int | None = None  # per generated token: its logprob and the top k; None = off
    prompt_logprobs: int | None = None  # the same for every prompt token; None = off

    def __post_init__(self):
        """Check every field (TypeError: wrong type, ValueError: out of range) and keep
        each in its plain type, in containers of its own (see checked())."""
        self.max_tokens = checks.integer("max_tokens", self.max_tokens, 1)
        self.temperature = checks.number("temperature", self.temperature, 0)
        self.top_k = checks.integer("top_k", self.top_k, 0)
        self.top_p = checks.number("top_p", self.top_p, maximum=1, above=0)
        self.min_p = checks.number("min_p", self.min_p, 0, 1)
        self.repetition_penalty = checks.number("repetition_penalty", self.repetition_penalty,
                                                above=0)
        self.seed = checks.optional_integer("seed", self.seed, 0)
        self.n = checks.integer("n", self.n, 1)
        self.stop = _stop_strings(self.stop)
        if not isinstance(self.stop_token_ids, (list, tuple, set, np.ndarray)):
            raise TypeError(f"stop_token_ids must be a list of token ids, got "
                            f"{type(self.stop_token_ids).__name__}")
        self.stop_token_ids = [checks.integer("stop_token_ids item", t, 0)
                               for t in self.stop_token_ids]
        self.ignore_eos = checks.boolean("ignore_eos", self.ignore_eos)
        self.presence_penalty = checks.number("presence_penalty", self.presence_penalty, -2, 2)
        self.frequency_penalty = checks.number("frequency_penalty", self.frequency_penalty, -2, 2)
        if not isinstance(self.logit_bias, dict):
            raise TypeError(f"logit_bias must be a dict of token id -> bias, got "
                            f"{type(self.logit_bias).__name__}")
        self.logit_bias = {checks.integer("logit_bias token id", t, 0):
                           checks.number(f"logit_bias[{t}]", b, -100, 100)
                           for t, b in self.logit_bias.items()}
        self.logprobs = checks.optional_integer("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        self.prompt_logprobs = checks.optional_integer("prompt_logprobs", self.prompt_logprobs,
                                                       0, MAX_LOGPROBS)

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


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator,
           token_ids=(), num_prompt_tokens: int = 0) -> int:
    """Pick the next token from logits (V,): penalties and bias (adjust_logits), then
    greedy or temperature -> top-k -> top-p -> min-p. token_ids: prompt + output so far."""
    logits = adjust_logits(logits, params, token_ids, num_prompt_tokens)
    if params.greedy:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / params.temperature
    if 0 < params.top_k < len(scaled):
        kth = np.partition(scaled, -params.top_k)[-params.top_k]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]  # mass of strictly more likely tokens
        drop = order[before >= params.top_p]  # the smallest set reaching top_p is kept
        probs[drop] = 0.0
        probs /= probs.sum()
    if params.min_p > 0.0:
        probs[probs < params.min_p * probs.max()] = 0.0
        probs /= probs.sum()
    return int(rng.choice(len(probs), p=probs))

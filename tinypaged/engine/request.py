"""Request: one prompt with its n samples (sequences) and their text so far."""
from __future__ import annotations

from dataclasses import dataclass

from ..model.pooling import Pooling
from ..outputs import CompletionOutput, RequestOutput, TokenLogprobs
from ..sampling import SamplingParams
from ..tokenizer import Tokenizer
from ..structured.grammar import CompiledGrammar
from .pooled import PooledState
from .sequence import Sequence
from .token_rules import TokenRules


@dataclass(slots=True, frozen=True)
class PreparedRequest:
    """A checked request with its prompt tokenized, not yet in the engine."""
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    grammar: CompiledGrammar | None = None  # params.structured_outputs, compiled
    lora: str | None = None  # the LoRA adapter it runs (its name); None: the base model
    pooling: Pooling | None = None  # an embedding request: how its prompt's states pool


class SampleText:
    """Text of one sample. Holds back the tail that could still become a stop string,
    so streamed text never has to be taken back."""

    def __init__(self, tokenizer: Tokenizer, params: SamplingParams, prompt_token_ids: list[int]):
        self.detok = tokenizer.detokenizer(prompt_token_ids, params.skip_special_tokens)
        self.stop = params.stop
        self.include_stop = params.include_stop_str_in_output
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""
        self.search_from = 0  # stop strings before this were passed over (may_end)
        self.finished = False

    def push(self, token_id: int, may_end=None) -> bool:
        """Add a token's text; True when a stop string appeared (the text is cut before
        it). may_end(text): whether the output may end as text (a grammar's say); a
        stop string where it may not is text like any other."""
        start = max(0, len(self.text) - self.holdback, self.search_from)
        self.text += self.detok.push(token_id)
        for s in self.stop:
            i = self.text.find(s, start)
            while i >= 0 and may_end is not None and not may_end(self.text[:i]):
                self.search_from = i + 1
                i = self.text.find(s, i + 1)
            if i >= 0:
                self.text = self.text[:i + len(s) if self.include_stop else i]
                return True
        return False

    def finish(self) -> None:
        if not self.finished:
            self.text += self.detok.flush()
            self.finished = True

    @property
    def visible(self) -> str:
        """The text a stream may show: all of it once finished, else all but the held-back
        tail (nothing while the text is shorter than the tail: a negative slice end would
        count from the end and show text that later disappears)."""
        return self.text if self.finished else self.text[:max(0, len(self.text) - self.holdback)]


class Request:
    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams, tokenizer: Tokenizer,
                 grammar: CompiledGrammar | None = None, rules: TokenRules | None = None,
                 pooling: Pooling | None = None):
        self.request_id, self.prompt, self.params = request_id, prompt, params
        self.prompt_token_ids = prompt_token_ids
        self.seqs = [Sequence(request_id, prompt_token_ids, params, 0)]
        if pooling is not None:  # an embedding: every row computed unless only the last is read
            self.seqs[0].pooled, self.seqs[0].every_row = PooledState(pooling), pooling.mode != "last"
        if grammar is not None:  # forks copy it with the sequence
            self.seqs[0].grammar = grammar.start()
        self.rules = rules if rules is not None and rules.active else None  # tokens forbidden
        self.texts = [SampleText(tokenizer, params, prompt_token_ids)]
        self.tokenizer = tokenizer
        self.aborted = False
        self.error: Exception | None = None  # set when a step failed for this request
        # filled while the prompt is computed, when params.prompt_logprobs is set
        self.prompt_logprobs: list[TokenLogprobs | None] = [None]

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Prompt logprobs asked for and not all collected yet."""
        return (self.params.prompt_logprobs is not None
                and len(self.prompt_logprobs) < len(self.prompt_token_ids))

    def add_sample(self, seq: Sequence) -> None:
        self.seqs.append(seq)
        self.texts.append(SampleText(self.tokenizer, self.params, self.prompt_token_ids))

    @property
    def finished(self) -> bool:
        return self.aborted or (len(self.seqs) == self.params.n
                                and all(s.is_finished for s in self.seqs))

    def output(self) -> RequestOutput:
        """A snapshot: every list is a copy, so another thread may keep it."""
        with_logprobs = self.params.logprobs is not None
        outs = [CompletionOutput(seq.sample_index, text.visible, seq.output_token_ids,
                                 seq.finish_reason,
                                 list(seq.logprobs) if with_logprobs else None,
                                 seq.cumulative_logprob if with_logprobs else None,
                                 self.tokenizer.token_text)
                for seq, text in zip(self.seqs, self.texts)]
        prompt_logprobs = (list(self.prompt_logprobs)
                           if self.params.prompt_logprobs is not None else None)
        pooled = self.seqs[0].pooled
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outs,
                             self.finished, prompt_logprobs, self.error,
                             self.seqs[0].num_cached_tokens, self.tokenizer.token_text,
                             None if pooled is None else pooled.vector)

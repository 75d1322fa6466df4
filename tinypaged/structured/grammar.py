"""Grammars for one model: llguidance's view of the tokenizer (built once, on first
use), compiled grammars cached by their text (bounded in bytes), and GrammarState,
the matcher that follows one sequence's tokens. A grammar runs under limits.py's
limits; one that goes over them fails its request with GrammarFailed, and its cache
entry keeps only the message, so the same grammar is refused at once next time.

llguidance is an optional extra (`pip install 'tinypaged[structured]'`): it is only
imported when a request asks for structured output.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict

import numpy as np

from ..tokenizer import Tokenizer
from .available import llguidance_module
from .limits import GrammarFailed, error_line, parser_limits
from .params import StructuredOutputs



def mask_words(vocab_size: int) -> int:
    """int32 words of one row's bit mask: token t is bit t % 32 of word t // 32."""
    return (vocab_size + 31) // 32


class GrammarState:
    """One sequence's place in its grammar (an llguidance LLMatcher)."""

    def __init__(self, matcher, compiled: "CompiledGrammar"):
        self.matcher, self.compiled = matcher, compiled

    def fork(self) -> "GrammarState":
        """An independent copy (a sibling sample goes its own way from here)."""
        return GrammarState(self.matcher.deep_copy(), self.compiled)

    def advance(self, token_id: int) -> None:
        """Take a sampled token; the mask allowed it, so a refusal is a limit reached
        (GrammarFailed) or a bug."""
        if not self.matcher.consume_token(token_id):
            self.check()
            raise RuntimeError(f"the grammar refused token {token_id}, which its mask "
                               f"allowed")

    def check(self) -> None:
        """GrammarFailed where the matcher went over a limit (its grammar's cache entry
        keeps only the message from now on)."""
        if self.matcher.is_error():
            raise self.compiled.failed(error_line(self.matcher.get_error()))

    @property
    def accepting(self) -> bool:
        """The output so far is a whole match: the request may end here."""
        return self.matcher.is_accepting()

    @property
    def complete(self) -> bool:
        """Nothing more may follow (EOS aside): the request is done."""
        return self.matcher.is_stopped()

    def accepts(self, text: str) -> bool:
        """Whether text, from the start, is a whole match (a stop string may end the
        output only where this holds for the text before it)."""
        return self.compiled.accepts(text)


class CompiledGrammar:
    """A grammar compiled for one tokenizer: a matcher at its start, which requests
    copy (deep_copy costs microseconds; compiling, a millisecond or more); or, once it
    went over a limit, only what failed."""

    def __init__(self, prototype, tokenizer, kind: str, nbytes: int):
        self.prototype, self.tokenizer = prototype, tokenizer  # untouched: copies run
        self.kind, self.nbytes = kind, nbytes
        self.failure: str | None = None

    def start(self) -> GrammarState:
        if self.failure is not None:
            raise GrammarFailed(self.failure)
        return GrammarState(self.prototype.deep_copy(), self)

    def failed(self, message: str) -> GrammarFailed:
        """Mark this grammar failed (its matcher let go) and return the error to raise."""
        if self.failure is None:
            self.failure = f"structured_outputs: {self.kind}: {message}"
            self.prototype, self.nbytes = None, 2 * len(self.failure)
        return GrammarFailed(self.failure)

    def accepts(self, text: str) -> bool:
        if self.failure is not None:
            return False
        matcher = self.prototype.deep_copy()
        return (matcher.consume_tokens(self.tokenizer.tokenize_str(text))
                and matcher.is_accepting())


class Grammars:
    """The grammars of one engine's model. Any thread may compile (requests are
    prepared in the callers' threads); masks are filled by the engine loop's."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids,
                 cache_bytes: int):
        """cache_bytes: what the compiled grammars may hold (EngineConfig's
        grammar_cache_memory); the least recently used go first."""
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self.cache_bytes = cache_bytes
        self._lock = threading.Lock()
        self._ll_tokenizer = None
        self._executor = None
        self._compiled: OrderedDict[str, CompiledGrammar] = OrderedDict()

    def start(self, structured: StructuredOutputs) -> GrammarState:
        """A fresh matcher at the start of the grammar; ValueError naming the problem
        when it does not compile or can match nothing."""
        return self.compile(structured).start()

    def compile(self, structured: StructuredOutputs) -> CompiledGrammar:
        """The grammar compiled (or found in the cache); GrammarFailed naming the
        problem when it does not compile, goes over a limit, or can match nothing."""
        ll = llguidance_module()
        with self._lock:
            compiled = self._compiled.get(structured.text)
            if compiled is not None:
                self._compiled.move_to_end(structured.text)
            else:
                tokenizer = self._llg_tokenizer(ll)
        if compiled is not None:
            if compiled.failure is not None:
                raise GrammarFailed(compiled.failure)
            return compiled
        before = resident_bytes()
        matcher = ll.LLMatcher(tokenizer, structured.text, log_level=0, limits=parser_limits(ll))
        mask = ll.numpy.allocate_token_bitmask(1, self.vocab_size)
        error = None
        if matcher.is_error():
            error = matcher.get_error()
        else:
            ll.numpy.fill_next_token_bitmask(matcher, mask, 0)
            error = matcher.get_error() if matcher.is_error() else self._walk_forced(ll, matcher)
        failure = error_line(error) if error else None if mask.any() else "matches no output at all"
        if failure is not None:  # remembered: the same grammar is refused at once
            compiled = CompiledGrammar(None, tokenizer, structured.kind, 0)
            refusal = compiled.failed(failure)
            self._keep(structured.text, compiled)
            raise refusal
        # what it holds: the memory its compiling took (the lexer, the first mask's
        # states), or at least its text; several compiling at once count high, not low
        nbytes = max(resident_bytes() - before, 2 * len(structured.text))
        compiled = CompiledGrammar(matcher, tokenizer, structured.kind, nbytes)
        self._keep(structured.text, compiled)
        return compiled

    def _walk_forced(self, ll, matcher) -> str | None:
        """The tokens every output must start with (a schema's `{"key":`), taken on a
        copy and the mask after them computed, here in the compiling thread: a lexer
        that blows up there (a pattern of a million states) fails now, not in an
        engine step that every running request waits for. Its error, or None."""
        walker = matcher.deep_copy()
        forced = walker.compute_ff_tokens()
        if forced and walker.consume_tokens(forced):
            ll.numpy.fill_next_token_bitmask(walker, ll.numpy.allocate_token_bitmask(
                1, self.vocab_size), 0)
        return walker.get_error() if walker.is_error() else None

    def _keep(self, text: str, compiled: CompiledGrammar) -> None:
        with self._lock:
            self._compiled.pop(text, None)
            self._compiled[text] = compiled
            total = self.cached_bytes  # (a grammar failed since counts its message only)
            while total > self.cache_bytes and len(self._compiled) > 1:
                _, dropped = self._compiled.popitem(last=False)
                total -= dropped.nbytes

    @property
    def cached_bytes(self) -> int:
        return sum(c.nbytes for c in list(self._compiled.values()))

    def _llg_tokenizer(self, ll):
        """llguidance's tokenizer, from the engine's tokenizer.json form (also for GGUF
        vocabularies, which tokenizer.py builds as one): 0.3 s for 49,152 tokens."""
        if self._ll_tokenizer is None:
            vocab = max(self.vocab_size, self.tokenizer.vocab_size)
            self._ll_tokenizer = ll.LLTokenizer(self.tokenizer.json_text(), n_vocab=vocab,
                                                eos_token=self.eos_token_ids)
        return self._ll_tokenizer

    def fill_masks(self, states: list[GrammarState]) -> np.ndarray:
        """Each state's allowed next tokens, one bit mask row each (len(states), words),
        computed in llguidance's threads."""
        ll = llguidance_module()
        masks = ll.numpy.allocate_token_bitmask(len(states), self.vocab_size)
        if self._executor is None:
            self._executor = ll.LLExecutor()
        ll.numpy.fill_next_token_bitmask_par(self._executor,
                                             [(s.matcher, i) for i, s in enumerate(states)], masks)
        for state in states:
            state.check()
        return masks


def resident_bytes() -> int:
    """This process's resident memory (Linux's /proc; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0

"""TokenRules: the tokens a request's params forbid at a step, as a bit mask row
(the layout of a grammar's, structured/grammar.py), so the sampler's one mask kernel
applies them all: allowed_token_ids, bad_words, and EOS, stop tokens before
min_tokens. A grammar's own mask is combined with them (bitwise and)."""
from __future__ import annotations

import numpy as np

from ..sampling import SamplingParams
from ..structured.grammar import mask_words
from ..tokenizer import Tokenizer


def bad_word_ids(tokenizer: Tokenizer, words: list[str]) -> list[tuple[int, ...]]:
    """Each word's tokens, alone and after a space (how it reads mid-text): vLLM's
    rule, which bans the last token of a word once the output ends with the rest."""
    found = set()
    for word in words:
        for text in (word.strip(), " " + word.strip()):
            ids = tuple(tokenizer.encode(text, add_special_tokens=False))
            if ids:
                found.add(ids)
    return sorted(found)


class TokenRules:
    def __init__(self, params: SamplingParams, tokenizer: Tokenizer, eos_token_ids: set[int],
                 vocab_size: int):
        self.params, self.vocab_size = params, vocab_size
        self.bad_words = bad_word_ids(tokenizer, params.bad_words)
        self.enders = sorted(set(params.stop_token_ids)
                             | (set() if params.ignore_eos else set(eos_token_ids)))
        self._allowed = None  # allowed_token_ids as a mask row, built on first use

    @property
    def active(self) -> bool:
        p = self.params
        return bool(p.allowed_token_ids is not None or self.bad_words or p.min_tokens)

    def banned(self, output: list[int]) -> list[int]:
        """Tokens this step may not take, given the output so far."""
        banned = list(self.enders) if len(output) < self.params.min_tokens else []
        for ids in self.bad_words:
            if len(ids) == 1 or (len(output) >= len(ids) - 1
                                 and tuple(output[len(output) - len(ids) + 1:]) == ids[:-1]):
                banned.append(ids[-1])
        return banned

    def mask(self, output: list[int], grammar_row: np.ndarray | None) -> np.ndarray | None:
        """The row's mask (int32 words), or None where nothing is forbidden."""
        banned = self.banned(output)
        allowed = self._allowed_row()
        if grammar_row is None and allowed is None and not banned:
            return None
        row = np.full(mask_words(self.vocab_size), -1, dtype=np.int32) \
            if grammar_row is None else grammar_row.copy()
        if allowed is not None:
            row &= allowed
        bits = row.view(np.uint32)
        for t in banned:
            bits[t >> 5] &= ~np.uint32(1 << (t & 31))
        return row

    def _allowed_row(self) -> np.ndarray | None:
        ids = self.params.allowed_token_ids
        if ids is None:
            return None
        if self._allowed is None:
            bits = np.zeros(mask_words(self.vocab_size) * 32, dtype=np.uint8)
            bits[ids] = 1
            self._allowed = np.packbits(bits, bitorder="little").view(np.int32)
        return self._allowed

"""Prompt-lookup proposals (speculative_config method "ngram").

A sequence's NgramIndex maps each n-gram of its tokens (n from prompt_lookup_min to
prompt_lookup_max) to where its latest occurrence ends; each proposal first indexes
the tokens the sequence gained since the last one (no rescan). A proposal looks up
the sequence's last n tokens, longest n first, and offers the tokens that followed
their latest earlier occurrence: in a document being copied or edited, what came
next there is likely what comes next here.
"""
from __future__ import annotations


class NgramIndex:
    def __init__(self, low: int, high: int):
        self.low, self.high = low, high
        self.ends: dict[tuple[int, ...], int] = {}  # n-gram -> end (exclusive) of its latest occurrence
        self.indexed = 0  # every n-gram ending at or before this position is in `ends`

    def _extend(self, tokens: list[int], upto: int) -> None:
        for end in range(max(self.indexed + 1, self.low), upto + 1):
            for n in range(self.low, min(self.high, end) + 1):
                self.ends[tuple(tokens[end - n:end])] = end
        self.indexed = max(self.indexed, upto)

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of tokens' longest
        indexed suffix; [] when no suffix of low tokens or more occurred before."""
        length = len(tokens)
        self._extend(tokens, length - 1)  # (n-grams ending at the last token: the suffix itself)
        for n in range(min(self.high, length - 1), self.low - 1, -1):
            end = self.ends.get(tuple(tokens[length - n:]))
            if end is not None:
                return tokens[end:end + k]
        return []


class NgramProposer:
    def __init__(self, num_tokens: int, low: int, high: int):
        self.num_tokens, self.low, self.high = num_tokens, low, high

    def propose(self, seq, limit: int) -> list[int]:
        """Up to min(num_tokens, limit) proposals to follow seq's tokens (its index is
        kept on it: seq.ngram_index)."""
        if seq.ngram_index is None:
            seq.ngram_index = NgramIndex(self.low, self.high)
        return seq.ngram_index.propose(seq.token_ids, min(self.num_tokens, limit))

    def propose_all(self, seqs: list, limits: list[int]) -> list[list[int]]:
        return [self.propose(seq, limit) if limit > 0 else [] for seq, limit in zip(seqs, limits)]

    def rollback(self, seq, kept: int) -> None:
        """(Nothing to roll back: the index follows the sequence's tokens.)"""

"""What sampling needs of each row of a step's logits (the protocol between the
engine and a backend).

A step's logits are (R, vocab): at batch 64 and a 49k vocabulary, 12.6 MB, which a
GPU would copy back every step. Most rows need far less: a greedy sample needs the
argmax, a top-k sample the k most likely tokens (plus one, to see a tie at the
k-th), and a chunk part-way through its prompt nothing at all. The engine says per
row what it needs (a `need`: NOT_NEEDED, WHOLE_ROW, or a count of candidates); the
backend leaves the logits where they are and hands over a StepLogits that holds
just that (on the GPU: whole rows copied only where needed, candidates found on the
device; on the host: the array). engine/step_logits.py draws tokens from it.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

NOT_NEEDED = 0  # a chunk part-way through its prompt: no sample, no logprobs
WHOLE_ROW = -1  # logprobs, penalties, a bias, a grammar, or sampling without a small top-k
MAX_CANDIDATES = 65  # top_k up to 64, plus one to see a tie


class StepLogits(Protocol):
    def rows(self, rows: list[int]) -> np.ndarray:
        """Whole rows (len(rows), vocab) as float32 on the host."""

    def candidates(self, row: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(values, token ids) of the row's most likely tokens, by value descending
        then id ascending (np.argmax's tie rule); None where only whole rows exist."""


class HostLogits:
    """Logits already on the host (the CPU backend): whole rows, no candidates."""

    def __init__(self, logits: np.ndarray):
        self.logits = logits

    def rows(self, rows: list[int]) -> np.ndarray:
        return self.logits if rows == list(range(len(self.logits))) else self.logits[rows]

    def candidates(self, row: int) -> None:
        return None

    def __len__(self) -> int:
        return len(self.logits)

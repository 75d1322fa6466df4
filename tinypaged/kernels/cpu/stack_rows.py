"""StackRows: a matrix held as rows start .. stop - 1 of a stack (stacks.py: a layer's
q/k/v or gate/up as one matrix), under its own name in the weights."""
from __future__ import annotations

import numpy as np


class StackRows:
    """stack: (the stacked matrix, start, stop). own: this matrix's rows as a form of
    their own (a LinearWeight view of the stack's rows), for a product of this matrix
    alone; None for a packed stack (the stack's product is then sliced)."""
    __slots__ = ("stack", "shape", "own")

    def __init__(self, stack, start: int, stop: int, own=None):
        self.stack, self.shape, self.own = (stack, start, stop), (stop - start, stack.shape[1]), own

    @property
    def kind(self):
        return self.stack[0].kind

    @property
    def nbytes(self) -> int:  # its share: the views of a stack add up to the stack
        whole = self.stack[0]
        return whole.nbytes * self.shape[0] // whole.shape[0]

    @property
    def ndim(self) -> int:
        return 2

    def product(self, x: np.ndarray, ahead=None) -> np.ndarray:
        """x @ these rows.T: its own form's product, or the stack's, sliced."""
        if self.own is not None:
            return self.own.product(x, ahead)
        whole, start, stop = self.stack
        return np.ascontiguousarray(whole.product(x, ahead)[:, start:stop])

    def dequantize(self, rows=None) -> np.ndarray:
        whole, start, stop = self.stack
        return whole.dequantize(np.arange(start, stop) if rows is None else start + np.asarray(rows))

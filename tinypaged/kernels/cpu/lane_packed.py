"""LanePacked: a packed matrix as the CPU multiplies it, laid out 16 rows to a group
(lanes.py) at load, with its product (lanes_product.py)."""
from __future__ import annotations

import numpy as np

from ...formats.packed import PackedWeight
from ...formats.quant_kind import QuantKind
from .lanes import lay_out, packed_rows
from .lanes_product import lanes_product
from .stack_rows import StackRows

LANE_ARRAYS = ("quants", "scales", "mins", "supers", "fifths")  # lanes.py has their layout


class LanePacked:
    """A packed matrix of kind `kind`, (N, K) = shape, its arrays laid out (lanes.py's
    docstring; None for those its kind lacks)."""
    __slots__ = ("kind", "shape", *LANE_ARRAYS)

    def __init__(self, kind: QuantKind, shape: tuple[int, int], quants, scales, mins=None,
                 supers=None, fifths=None):
        self.kind, self.shape = kind, shape
        self.quants, self.scales, self.mins, self.supers, self.fifths = quants, scales, mins, supers, fifths

    @classmethod
    def of(cls, weight: PackedWeight, in_place: bool = False) -> "LanePacked":
        """weight laid out; in_place: in its quants' own memory where they allow it
        (weight is then lost)."""
        return cls(weight.kind, weight.shape, **lay_out(weight, in_place))

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in LANE_ARRAYS if getattr(self, name) is not None)

    @property
    def ndim(self) -> int:
        return 2

    def product(self, x: np.ndarray, ahead=None) -> np.ndarray:
        """round_activations(x) (M, K) @ W.T -> (M, N); ahead: as reference.linear's."""
        return lanes_product(x, self, ahead)

    def rows(self, rows) -> PackedWeight:
        """The selected rows (an index array) as a PackedWeight."""
        return packed_rows(self.kind, self.shape, {name: getattr(self, name) for name in LANE_ARRAYS}, rows)

    def dequantize(self, rows=None) -> np.ndarray:
        """float32 rows (all by default), as PackedWeight.dequantize (embedding lookups)."""
        return self.rows(np.arange(self.shape[0]) if rows is None else rows).dequantize()


def lay_out_weights(weights: dict) -> dict:
    """The weights with every PackedWeight the lanes kernels take laid out; each name
    that held it (a tied lm_head, the views of a stack) then holds the new form.
    Each matrix's bytes are moved in its own memory where they allow it (else one
    matrix at a time is copied). Takes the dict over: the PackedWeights it held,
    and anything sharing their arrays, are lost."""
    names = list(weights)
    for name in names:
        w = weights[name]
        target = w.stack[0] if isinstance(w, StackRows) else w
        if not isinstance(target, PackedWeight):
            continue
        laid = LanePacked.of(target, in_place=True)
        for other in names:
            held = weights[other]
            if held is target:
                weights[other] = laid
            elif isinstance(held, StackRows) and held.stack[0] is target:
                weights[other] = StackRows(laid, held.stack[1], held.stack[2])
    return weights

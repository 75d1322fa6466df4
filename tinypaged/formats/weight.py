"""The one protocol every weight matrix answers, whatever form holds it (a plain
float array aside: its dtype says it): a PackedWeight (packed.py), and each
backend's own forms (kernels/cpu: LinearWeight, LanePacked, StackRows;
kernels/cuda: DeviceFloat, DevicePacked; the reference's WidenedPacked):

    kind     its QuantKind (quant_kind.py), named, never inferred from array types
    shape    (N, K): rows of outputs, columns of inputs
    nbytes   the bytes it holds (a stack's rows: their share)

A backend's form also owns its product: the CPU's `product(x)` returns x @ W.T, a
device form's `product(launch, x, bias, has_bias, out)` launches it. Which form a
matrix takes is decided once, when the backend prepares the weights; no product is
chosen by testing a weight's class at run time.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from .quant_kind import QuantKind


class Weight(Protocol):
    kind: QuantKind
    shape: tuple[int, int]
    nbytes: int


def is_packed(weight) -> bool:
    """Whether the weight is a quantized kind (its products take x rounded to int8);
    a plain array never is."""
    return not isinstance(weight, np.ndarray) and weight.kind.packable

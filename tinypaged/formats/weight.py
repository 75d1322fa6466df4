"""The one protocol every weight form answers, whatever holds it (a plain float array
aside: its dtype says it): a PackedWeight (packed.py), a backend's own forms (kernels/cpu's LinearWeight,
LanePacked and StackRows; kernels/cuda's DevicePacked; the reference's
WidenedPacked):

    kind     its QuantKind (quant_kind.py), named, never inferred from array types
    shape    (N, K): rows of outputs, columns of inputs
    nbytes   the bytes it holds (a stack's rows: their share)

and, for every form a backend multiplies with, that backend's `linear(x, weight)`
into a fresh (or reused) output."""
from __future__ import annotations

from typing import Protocol

import numpy as np

from .quant_kind import KINDS, QuantKind


class Weight(Protocol):
    kind: QuantKind
    shape: tuple[int, int]
    nbytes: int


class KindOfGGMLType:
    """`kind` and `type_name` of a form that holds its GGML type code as `ggml_type`
    (PackedWeight, kernels/cpu's LanePacked)."""
    __slots__ = ()

    @property
    def kind(self) -> QuantKind:
        return KINDS[self.ggml_type]

    @property
    def type_name(self) -> str:
        return self.kind.name


def is_packed(weight) -> bool:
    """Whether the weight is a quantized kind (its products take x rounded to int8);
    a plain array never is."""
    return not isinstance(weight, np.ndarray) and weight.kind.packable


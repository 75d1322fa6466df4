"""The one protocol every weight form answers, whatever holds it: a float array, a
PackedWeight (packed.py), a backend's own forms (kernels/cpu's LinearWeight,
LanePacked and StackRows; kernels/cuda's DevicePacked; the reference's
WidenedPacked):

    kind     its QuantKind (quant_kind.py), named, never inferred from array types
    shape    (N, K): rows of outputs, columns of inputs
    nbytes   the bytes it holds (a stack's rows: their share)

and, for every form a backend multiplies with, that backend's `linear(x, weight)`
into a fresh (or reused) output. `kind_of` gives a plain array's kind too."""
from __future__ import annotations

from typing import Protocol

import numpy as np

from .quant_kind import F16, F32, KINDS, QuantKind

_ARRAY_KINDS = {np.dtype(np.float32): KINDS[F32], np.dtype(np.float16): KINDS[F16]}


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


def kind_of(weight) -> QuantKind:
    """A weight form's kind; a float array's from its dtype (F32, F16)."""
    if isinstance(weight, np.ndarray):
        kind = _ARRAY_KINDS.get(weight.dtype)
        if kind is None:
            raise TypeError(f"a weight array of dtype {weight.dtype} has no GGML kind")
        return kind
    return weight.kind


def is_packed(weight) -> bool:
    """Whether the weight is a quantized kind (its products take x rounded to int8);
    a plain array never is."""
    return not isinstance(weight, np.ndarray) and weight.kind.packable


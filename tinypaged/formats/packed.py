"""PackedWeight: a quantized weight matrix kept quantized, never widened whole.

GGUF stores Q8_0 / Q4_0 / Q4_1 as blocks of 32 weights with a float16 scale (and
min) in front of each (ggml_quant.py has the layouts). Kept like that, the scales
interrupt the quants every 18-34 bytes and numba's loops do not vectorize (a Q8_0
GEMV ran 4-6x slower than the float16 one). So at load the blocks are split into
arrays of the same bytes:
    quants  (N, K) int8 for Q8_0; (N, K/2) uint8 for Q4_x, byte p of a row holding
            weight p in its low nibble and weight p + K/2 in its high one
    scales  (N, K/32) float16 bits (uint16), one per block of 32 weights along K
    mins    (N, K/32) float16 bits, Q4_1 only
Weight (n, k) = scale * q (Q8_0), scale * (q - 8) (Q4_0), scale * q + min (Q4_1),
with the scale and min of block k // 32. `dequantize()` is the NumPy reference.

Q4_K (super-blocks of 256 weights in eight 32-weight sub-blocks) is Q4_1 whose
block scale and min are computed: weight = (d * sc) * q - dmin * m, with 6-bit
integers sc and m per sub-block and float16 d and dmin per super-block. d * sc (an
11-bit mantissa times a 6-bit integer) and dmin * m are exact in float32, so the
Q4_1 kernels serve it with only the scale's and min's source changed:
    quants  (N, K/2) uint8, as Q4_x
    scales  (N, K/32) uint8: sc        mins (N, K/32) uint8: m
    supers  (N, K/256, 2) float16 bits: d, dmin
4.625 bits a weight, against the file's 4.5.

Q5_0 and Q5_1 are Q4_0 and Q4_1 with a fifth bit per weight: q = nibble + 16 * bit,
weight = scale * (q - 16) (Q5_0) or scale * q + min (Q5_1). The nibbles are laid
out as Q4_x's; the fifth bits are kept apart, in column order:
    highs   (N, K/8) uint8: bit j of byte i is weight 8i + j's fifth bit
(the file's qh words, which hold block b's 32 bits little-endian, are exactly that
row by row). 5.5 / 6 bits a weight, as in the file. Q5_K is Q4_K with such a plane
(5.6875 bits, as the file's 5.5 + the unpacked 6-bit scales and mins).

Q6_K (super-blocks of 256 weights, sixteen 16-weight sub-blocks): weight = d * sc *
(q - 32), q 6 bits, sc an int8 per 16 weights, float16 d per super-block:
    quants  (N, K/2) uint8: q's low 4 bits, laid out as Q4_x
    highs   (N, K/4) uint8: q's bits 4 and 5 as two bit planes a block: bytes 8b .. 8b + 3
            hold block b's bits 4 (bit j: weight 32b + j), bytes 8b + 4 .. 8b + 7 its bits 5
    scales  (N, K/16) int8: sc       supers (N, K/256, 1) float16 bits: d
6.5625 bits a weight, as in the file.
"""
from __future__ import annotations

import numpy as np

from .ggml_quant import quantize
from . import kquant
from .quant_kind import GGML_TYPE_NAMES, KINDS, QuantKind, QK

ROW_ARRAYS = ("quants", "scales", "mins", "supers", "highs")  # a PackedWeight's arrays, rows first


class PackedWeight:
    __slots__ = ("kind", "shape", "quants", "scales", "mins", "supers", "highs")

    def __init__(self, kind: QuantKind | int, shape: tuple[int, int], quants: np.ndarray,
                 scales: np.ndarray, mins: np.ndarray | None = None,
                 supers: np.ndarray | None = None, highs: np.ndarray | None = None):
        self.kind = kind if isinstance(kind, QuantKind) else KINDS[kind]  # (files name it by code)
        self.shape = (int(shape[0]), int(shape[1]))
        self.quants, self.scales, self.mins, self.supers = quants, scales, mins, supers
        self.highs = highs

    @property
    def ggml_type(self) -> int:
        return self.kind.code

    @staticmethod
    def can_pack(ggml_type: int, columns: int) -> bool:
        """Whether rows of `columns` weights of this kind can be kept packed
        (QuantKind.row_multiple)."""
        kind = KINDS.get(ggml_type)
        return kind is not None and kind.packable and columns % kind.row_multiple == 0

    def arrays(self) -> list:
        return [getattr(self, name) for name in ROW_ARRAYS]

    def with_rows(self, pick, rows: int) -> "PackedWeight":
        """The same kind with pick(array) of each array (a selection of `rows` rows)."""
        return PackedWeight(self.ggml_type, (rows, self.shape[1]),
                            *(None if a is None else pick(a) for a in self.arrays()))

    @classmethod
    def concatenate(cls, parts: list) -> "PackedWeight":
        """One matrix of the parts' rows in order (one kind, one width)."""
        first = parts[0]
        return cls(first.ggml_type, (sum(p.shape[0] for p in parts), first.shape[1]),
                   *(None if getattr(first, name) is None
                     else np.concatenate([getattr(p, name) for p in parts]) for name in ROW_ARRAYS))

    @classmethod
    def from_bytes(cls, raw: np.ndarray, ggml_type: int, shape: tuple[int, int]) -> "PackedWeight":
        """From a tensor's bytes as GGUF stores them (uint8, any shape)."""
        n, k = shape
        if not cls.can_pack(ggml_type, k):
            raise ValueError(f"a {GGML_TYPE_NAMES.get(ggml_type, ggml_type)} matrix of {k} "
                             f"columns cannot be kept packed (Q8_0: a multiple of 32 columns; "
                             f"Q4_0, Q4_1, Q5_0, Q5_1: of 64; Q4_K, Q5_K, Q6_K: of 256)")
        if KINDS[ggml_type].is_k_quant:  # (kquant.py: the K-quants' formats)
            return cls(ggml_type, shape, *kquant.split(raw, ggml_type, shape))
        kind = KINDS[ggml_type]  # (a 32-value kind: quant_kind.py's layouts)
        whole_bytes = kind.bits == 8  # Q8_0's q: a byte each, not nibbles
        head = kind.block_bytes - (QK if whole_bytes else QK // 2)  # d, m, qh
        blocks = np.asarray(raw, dtype=np.uint8).reshape(n, k // QK, -1)  # (N, K/32, bytes)
        scales = np.ascontiguousarray(blocks[:, :, 0:2]).view(np.uint16)[:, :, 0]
        mins = np.ascontiguousarray(blocks[:, :, 2:4]).view(np.uint16)[:, :, 0] if kind.has_mins else None
        body = blocks[:, :, head:]
        if whole_bytes:
            return cls(ggml_type, shape, np.ascontiguousarray(body).view(np.int8).reshape(n, k),
                       scales, mins)
        highs = np.ascontiguousarray(blocks[:, :, head - 4:head]).reshape(n, k // 8) \
            if kind.high_bits else None  # qh: block b's bits, little-endian
        values = np.concatenate([body & 15, body >> 4], axis=2).reshape(n, k)  # GGUF order
        return cls(ggml_type, shape, _nibble_pairs(values), scales, mins, highs=highs)

    @classmethod
    def quantize(cls, w: np.ndarray, ggml_type: int, rows_at_once: int = 2048) -> "PackedWeight":
        """A float matrix quantized as llama.cpp's reference quantizers round; a few
        rows at a time, so the quantizer's float temporaries stay small (whole, they
        took ~500 MB for SmolLM2's 49152 x 576 embedding)."""
        raw = np.concatenate([quantize(w[i:i + rows_at_once], ggml_type)
                              for i in range(0, len(w), rows_at_once)])
        return cls.from_bytes(raw, ggml_type, w.shape)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays() if a is not None)

    @property
    def ndim(self) -> int:
        return 2

    def values(self, rows=slice(None)) -> np.ndarray:
        """The stored integers q of the selected rows, (r, K) in column order."""
        q = self.quants[rows]
        if self.kind.bits == 8:  # (Q8_0: int8 q, whole bytes)
            return q.astype(np.float32)
        q = np.concatenate([q & 15, q >> 4], axis=1)
        if self.highs is not None:  # the bits above the nibble
            q = q | kquant.high_values(self.kind, self.highs[rows])
        return q.astype(np.float32)

    def dequantize(self, rows=slice(None)) -> np.ndarray:
        """float32 (r, K) of the selected rows (all by default): the reference."""
        q = self.values(rows)
        if self.kind.is_k_quant:
            return kquant.weights(self.kind, q, self.scales[rows], None if self.mins is None else self.mins[rows],
                                  self.supers[rows])
        scale = np.repeat(self.scales[rows].view(np.float16).astype(np.float32), QK, axis=1)
        if self.mins is None:  # Q8_0 (offset 0: q - 0 is q, exact), Q4_0, Q5_0
            return scale * (q - np.float32(self.kind.offset))
        low = np.repeat(self.mins[rows].view(np.float16).astype(np.float32), QK, axis=1)
        return scale * q + low

    def take_rows(self, rows: np.ndarray) -> "PackedWeight":
        """These rows of the weights, in this order (Q/K rows are unpermuted at load,
        Phi-3's fused matrices split)."""
        return self.with_rows(lambda a: np.ascontiguousarray(a[rows]), len(rows))


def _nibble_pairs(values: np.ndarray) -> np.ndarray:
    """(N, K) values below 16 -> (N, K/2) bytes: column p in the low nibble, p + K/2 in
    the high one."""
    half = values.shape[1] // 2
    return (values[:, :half] | (values[:, half:] << 4)).astype(np.uint8)


"""The GGML tensor kinds, one table: a `QuantKind` per kind says how its blocks are
laid out in a file and how PackedWeight keeps them (packed.py has the arrays).

Quantized kinds pack a row's weights (the last, fastest axis) in blocks:
    Q8_0: f16 d, i8 q[32]                      x = d * q
    Q4_0: f16 d, u8 qs[16]                     x = d * (q - 8)
    Q4_1: f16 d, f16 m, u8 qs[16]              x = d * q + m
    Q5_0: f16 d, u8 qh[4], u8 qs[16]           x = d * (q - 16)
    Q5_1: f16 d, f16 m, u8 qh[4], u8 qs[16]    x = d * q + m
In Q4_x and Q5_x, byte j holds value j in its low nibble and value j + 16 in its
high one; Q5_x's fifth bits are the 32 bits of qh (little-endian), bit j for value j.
K-quants (what most GGUF files on the hub use) pack 256 values in a super-block of
sub-blocks with their own 6- or 8-bit scales (kquant.py has the layouts):
    Q4_K: 144 bytes, Q5_K: 176, Q6_K: 210.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16 = 0, 1, 2, 3, 6, 7, 8, 30
Q4_K, Q5_K, Q6_K = 12, 13, 14

GGML_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
    16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S",
    22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
    29: "IQ1_M", 30: "BF16",
}

QK = 32  # weights a quantization block (a K-quant's sub-block of scale and min)
QK_K = 256  # weights a K-quant super-block


@dataclass(frozen=True, slots=True)
class QuantKind:
    """One GGML kind. scales: how a block's scale (and min) are read once packed:
    "float" (none: F32/F16/BF16), "f16" (a float16 a 32-weight block), "k6" (6-bit
    scale and min a 32-weight block times float16 d and dmin a super-block), "i8"
    (an int8 scale a 16 weights times float16 d a super-block)."""
    code: int
    block: int  # weights a block in the file
    block_bytes: int
    scales: str
    offset: int = 0  # what a kind without mins subtracts from q before scaling
    has_mins: bool = False
    high_bits: int = 0  # bits of q above the low nibble, kept in a PackedWeight's `highs`

    @property
    def name(self) -> str:
        return GGML_TYPE_NAMES[self.code]

    @property
    def bits(self) -> int:
        """Bits of a weight: a float kind's, or its q's: 8 (Q8_0), a nibble and its high
        bits (4, 5, 6)."""
        if not self.packable:
            return 8 * self.block_bytes
        return 8 if self.code == Q8_0 else 4 + self.high_bits

    @property
    def is_k_quant(self) -> bool:
        return self.block == QK_K

    @property
    def packable(self) -> bool:
        return self.scales != "float"

    @property
    def row_multiple(self) -> int:
        """Columns a packed row's length must be a multiple of: Q8_0 whole blocks; the
        nibble kinds an even number (the nibbles pair weight p with p + K/2);
        K-quants whole super-blocks."""
        return self.block if self.code == Q8_0 or self.is_k_quant else 2 * self.block


KINDS = {k.code: k for k in (
    QuantKind(F32, 1, 4, "float"), QuantKind(F16, 1, 2, "float"), QuantKind(BF16, 1, 2, "float"),
    QuantKind(Q8_0, QK, 2 + QK, "f16"),
    QuantKind(Q4_0, QK, 2 + QK // 2, "f16", offset=8),
    QuantKind(Q4_1, QK, 4 + QK // 2, "f16", has_mins=True),
    QuantKind(Q5_0, QK, 6 + QK // 2, "f16", offset=16, high_bits=1),
    QuantKind(Q5_1, QK, 8 + QK // 2, "f16", has_mins=True, high_bits=1),
    QuantKind(Q4_K, QK_K, 144, "k6", has_mins=True),
    QuantKind(Q5_K, QK_K, 176, "k6", has_mins=True, high_bits=1),
    QuantKind(Q6_K, QK_K, 210, "i8", offset=32, high_bits=2),
)}
BLOCK_LAYOUT = {code: (k.block, k.block_bytes) for code, k in KINDS.items()}  # (weights, bytes)
K_QUANTS = tuple(code for code, k in KINDS.items() if k.is_k_quant)
# read, then held as REQUANTIZE_TO: Q5_x rows that PackedWeight cannot keep (an odd
# number of blocks). Every other quantized kind is kept packed (packed.py).
REQUANTIZED, REQUANTIZE_TO = (Q5_0, Q5_1), Q8_0
# what a float model can be quantized to at load (--quantization; ggml_quant.quantize)
QUANTIZE_TARGETS = (Q8_0, Q4_0, Q4_1)
SUPPORTED = ", ".join(k.name for k in KINDS.values())


def check_supported(ggml_type: int, name: str) -> None:
    """A ValueError naming the tensor and its kind, when we cannot read that kind."""
    if ggml_type not in KINDS:
        type_name = GGML_TYPE_NAMES.get(ggml_type, f"unknown type {ggml_type}")
        raise ValueError(f"tensor {name!r} uses quantisation type {type_name}, "
                         f"which is not supported (supported: {SUPPORTED})")


def tensor_nbytes(ggml_type: int, shape: tuple[int, ...], name: str) -> int:
    """Bytes a tensor occupies; 0 for a kind we cannot size (rejected on load)."""
    if ggml_type not in KINDS:
        return 0
    kind = KINDS[ggml_type]
    n = math.prod(shape)  # exact: dims a file lies about must not wrap around int64
    if shape and shape[-1] % kind.block:
        raise ValueError(f"tensor {name!r}: last dimension {shape[-1]} is not a multiple of "
                         f"the {kind.name} block size {kind.block}")
    return n // kind.block * kind.block_bytes

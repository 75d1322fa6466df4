"""The weight matrices on the device, each with the kernels that read its kind: a
float matrix (DeviceFloat: float16 or float32, matmul.py's kernels) or a packed one
(DevicePacked: the host's PackedWeight arrays as they are, packed_matmul.py's
kernels for Q8_0 and Q4_x, kquant_matmul.py's for Q5_x and the K-quants).

Each launches its own products (`product`, and the fused q/k/v and gate/up GEMVs):
the backend hands it a launch function and the arrays, never asks what it is. The
kernels a packed kind reads are found once, in PACKED_KERNELS, by its QuantKind. x may
be a NormedRows (normed_rows.py): a float matrix's GEMVs fold its norm in, any other
product takes its rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda

from ...formats.quant_kind import F16, F32, KINDS
from . import elementwise, kquant_matmul, matmul, packed_matmul, tiled_matmul
from .normed_rows import NormedRows, rows_of


@dataclass(frozen=True)
class MatrixKernels:
    gemv: object  # (x, matrix, bias, has_bias, out): decode rows
    qkv: object | None  # (x, wq, wk, wv, bq, bk, bv, has_bias, q, k, v): None, three GEMVs
    gate_up_silu: object  # (x, w_gate, w_up, out)
    tiled: tiled_matmul.TiledKernels  # past the GEMVs' rows: batches of 9+ and prefill
    upload: object = None  # packed: PackedWeight -> (device arrays, decode's matrix, tiled's)
    normed: tuple | None = None  # the GEMVs with a norm folded in (NormedRows' x), as below
    paired: object = None  # gemv's signature, a block per two rows (matmul.pairs_rows); None: none
    # (gemv, qkv, gate_up_silu, paired) for one row of x (batch 1), where the kind has
    # them: the steps' loads hoisted; None in it, or for it: the kernels above
    one_row: tuple | None = None


FLOAT_KERNELS = MatrixKernels(matmul.gemv_rows, matmul.gemv_qkv, matmul.gemv_gate_up_silu,
                              tiled_matmul.FLOAT_TILED, normed=matmul.NORMED_GEMVS,
                              paired=matmul.gemv_paired_rows,
                              one_row=(matmul.gemv_one_row, None, None, matmul.gemv_one_row_paired))
GEMV_ROWS, GEMV_QKV, GEMV_GATE_UP, GEMV_PAIRED = range(4)  # a GEMV's place in MatrixKernels.normed
# (the paired one has none there: x's rows are written for it)


def _packed(family: tuple, one_row: tuple, tiled, upload) -> MatrixKernels:
    gemv, qkv, gate_up_silu, paired = family
    return MatrixKernels(gemv, qkv, gate_up_silu, tiled, upload, paired=paired, one_row=one_row)


PACKED_KERNELS = {  # by QuantKind.code
    **{code: _packed(family, packed_matmul.ONE_ROW_FAMILIES[code], packed_matmul.TILED_PACKED,
                     packed_matmul.upload)
       for code, family in packed_matmul.GEMV_FAMILIES.items()},
    **{code: _packed(family, kquant_matmul.ONE_ROW_KERNELS[code], kquant_matmul.TILED_KERNELS[code],
                     kquant_matmul.upload)
       for code, family in kquant_matmul.DECODE_KERNELS.items()},
}


def _decode(x) -> bool:
    """Few enough rows of x for the decode GEMVs (else the tiled products)."""
    return x.shape[0] <= matmul.GEMV_MAX_ROWS


def decode_gemv(kernels: MatrixKernels, which: int, x_rows: int):
    """GEMV `which` (GEMV_ROWS, GEMV_QKV, GEMV_GATE_UP, GEMV_PAIRED) for x_rows rows of x:
    the kind's one-row kernel for one where it has it, else its decode kernel (None:
    the kind has no such kernel)."""
    if kernels.one_row is not None and x_rows == 1 and kernels.one_row[which] is not None:
        return kernels.one_row[which]
    return (kernels.gemv, kernels.qkv, kernels.gate_up_silu, kernels.paired)[which]


def _gemv_input(kernels: MatrixKernels, which: int, x) -> tuple:
    """(kernel, x, extra arguments) of GEMV `which` over x (an array or NormedRows): a
    norm still owed is folded into the kind's normed GEMV where it has one, else
    its rows are written first (decode_gemv's kernel)."""
    if (isinstance(x, NormedRows) and not x.written and kernels.normed is not None
            and which < len(kernels.normed) and x.shape[0] <= matmul.NORMED_MAX_ROWS):
        x_in, norm = x.fold_args()
        return kernels.normed[which], x_in, (norm,)
    return decode_gemv(kernels, which, x.shape[0]), rows_of(x), ()


class DeviceMatrix:
    """What both forms share: kind, shape, nbytes (formats/weight.py), `kernels`, the
    arguments their GEMVs (`decode`) and tiled product (`tiled`) take, and whether
    their products take x rounded to int8 blocks (`rounds_x`)."""
    __slots__ = ("kind", "shape", "kernels", "decode", "tiled", "arrays")
    rounds_x = False

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays)

    def fuses_with(self, *others) -> bool:
        """Whether one fused kernel reads self and others alike (a file may quantize
        gate and up, or q, k and v, differently)."""
        return all(o.kind is self.kind and o.kernels is self.kernels for o in others)

    def product(self, launch, x, bias, has_bias, out) -> None:
        """out = x @ W.T (+ bias): the GEMV for decode rows, else the tiled product."""
        if _decode(x):
            paired = (decode_gemv(self.kernels, GEMV_PAIRED, x.shape[0]) is not None
                      and matmul.pairs_rows(self.shape[0]))
            kernel, x, norm = _gemv_input(self.kernels, GEMV_PAIRED if paired else GEMV_ROWS, x)
            launch(kernel, matmul.gemv_blocks(-(-self.shape[0] // 2) if paired else self.shape[0]),
                   matmul.GEMV_ROW_THREADS, x, self.decode, bias, has_bias, out, *norm)
        else:
            tiled_matmul.launch_tiled(launch, self.kernels.tiled.product, rows_of(x), (self.tiled,),
                                      out.shape[1], bias, has_bias, out)

    def qkv(self, launch, x, wk, wv, biases, has_bias, outs) -> None:
        """q, k, v = x @ (self, wk, wv).T (+ biases) in one launch (the three fuse:
        fuses_with): a GEMV for decode rows (three where the kind has no fused one),
        else the tiled product over their rows side by side."""
        fused = self.kernels.tiled.qkv if not _decode(x) else decode_gemv(self.kernels, GEMV_QKV, x.shape[0])
        if fused is None:
            for w, bias, out in zip((self, wk, wv), biases, outs):
                w.product(launch, x, bias, has_bias, out)
        elif not _decode(x):
            tiled_matmul.launch_tiled(launch, fused, rows_of(x), (self.tiled, wk.tiled, wv.tiled),
                                      sum(out.shape[1] for out in outs), *biases, has_bias, *outs)
        else:
            rows = self.shape[0] + wk.shape[0] + wv.shape[0]
            kernel, x, norm = _gemv_input(self.kernels, GEMV_QKV, x)
            launch(kernel, matmul.gemv_blocks(rows), matmul.GEMV_ROW_THREADS,
                   x, self.decode, wk.decode, wv.decode, *biases, has_bias, *outs, *norm)

    def gate_up_silu(self, launch, x, w_up, out) -> None:
        """out = silu(x @ self.T) * (x @ w_up.T) in one launch (the GEMV for decode rows;
        a kind without a fused tiled kernel: two products and SiLU)."""
        if _decode(x):
            kernel, x, norm = _gemv_input(self.kernels, GEMV_GATE_UP, x)
            launch(kernel, matmul.gemv_blocks(self.shape[0]), matmul.GEMV_ROW_THREADS,
                   x, self.decode, w_up.decode, out, *norm)
            return
        x = rows_of(x)
        if self.kernels.tiled.gate_up_silu is None:  # two products, then SiLU
            gate, up, no_bias = launch.empty(*out.shape), launch.empty(*out.shape), launch.empty(1)
            self.product(launch, x, no_bias, False, gate)
            w_up.product(launch, x, no_bias, False, up)
            launch(elementwise.silu_mul, -(-out.size // 256), 256, gate, up, out)
        else:
            tiled_matmul.launch_tiled(launch, self.kernels.tiled.gate_up_silu, x, (self.tiled, w_up.tiled),
                                      tiled_matmul.gate_up_columns(out.shape[1]), out)


class DeviceFloat(DeviceMatrix):
    """A float matrix (N, K) uploaded as dtype (float16 or float32)."""
    __slots__ = ()

    def __init__(self, weight: np.ndarray, dtype):
        array = cuda.to_device(np.ascontiguousarray(weight, dtype=dtype))
        self.kind = KINDS[F16 if np.dtype(dtype) == np.float16 else F32]
        self.shape, self.kernels, self.arrays = array.shape, FLOAT_KERNELS, (array,)
        self.decode = self.tiled = array


class DevicePacked(DeviceMatrix):
    """A PackedWeight's arrays on the device, as the host holds them (float16 scales and
    mins as float16)."""
    __slots__ = ()
    rounds_x = True

    def __init__(self, packed):
        self.shape, self.kind = packed.shape, packed.kind
        self.kernels = PACKED_KERNELS[packed.kind.code]
        self.arrays, self.decode, self.tiled = self.kernels.upload(packed)

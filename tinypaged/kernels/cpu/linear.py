"""CPU matrix products: numba kernels for decode batches, BLAS for prefill.

Every weight matrix is held once, in its narrowest exact form: packed quantized
blocks (PackedWeight), float16 or bfloat16 bits when either holds the matrix
exactly (F16 and BF16 checkpoints), float32 otherwise (LinearWeight).

A packed weight is laid out 16 rows to a group at load (lanes.py) and multiplies x
rounded to int8 blocks, through the lanes GEMV or GEMM (lanes_product.py), which
give a row the same bits whatever M is. For a LinearWeight the path depends on M,
the rows of x:
    M <= F16_GEMV_MAX_ROWS  a GEMV streaming each weight row once (bandwidth-bound):
                            _gemv_f16 here
    M <= NUMBA_MAX_ROWS     gemm.gemm_narrow: four weight rows widened at a time
                            into L1, eight accumulators (arithmetic-bound)
    larger (prefill)        BLAS: on the float32 matrix, or on float32 tiles widened
                            from the narrow form (tiles.py), the cost of widening
                            spread over the many rows of x

The numba and BLAS paths never alternate within a step's layers: numba's OpenMP
workers and OpenBLAS's threads both spin after their work, and interleaving them
on two cores costs milliseconds per switch.
"""
import threading

import numpy as np
from numba import float32, prange

from ...formats.quant_kind import BF16, F16, F32, KINDS, QuantKind
from ...formats.weight_dict import convert_matrices
from ...jit_cache import cached_njit
from .common import N_CHUNKS, f16_bits_to_f32
from .gemm import GROUP, gemm_narrow
from .tiles import tiled_matmul, widen_tile

F16_GEMV_MAX_ROWS = 4  # up to this many rows of x take the float16 GEMV
NUMBA_MAX_ROWS = 64  # up to this many, numba's GEMM; beyond, BLAS
_last_product = threading.local()  # .blas: this thread's last product ran in BLAS's threads


def blas_in_use() -> bool:
    """Whether this thread's last matrix product went through BLAS (a float matrix and
    more than NUMBA_MAX_ROWS rows): the ops around it then keep off numba's threads."""
    return getattr(_last_product, "blas", False)


@cached_njit(parallel=True, fastmath=True)
def _gemv_f16(x, w_bits, out):
    """out (M, N) = x (M, K) @ W.T for W given as float16 bits (N, K), small M.

    Threads split W's rows into N_CHUNKS ranges; each row is widened once into an
    L1-resident buffer and dotted with every row of x. Traffic: W once (2 bytes
    per weight), x and out negligible.
    """
    n_rows, width = x.shape
    n_out = w_bits.shape[0]
    per_chunk = -(-n_out // N_CHUNKS)
    for c in prange(N_CHUNKS):
        row = np.empty(width, dtype=np.float32)
        for n in range(c * per_chunk, min(n_out, (c + 1) * per_chunk)):
            for k in range(width):
                row[k] = f16_bits_to_f32(w_bits[n, k])
            for m in range(n_rows):
                acc = float32(0.0)
                for k in range(width):
                    acc += row[k] * x[m, k]
                out[m, n] = acc


class LinearWeight:
    """A float weight matrix (N, K), held once: `data` is its float16 bits (uint16)
    when float16 holds every value exactly (kind F16: F16 checkpoints), else its
    bfloat16 bits (held as int16, to tell the two apart) when bfloat16 does (kind
    BF16: BF16 checkpoints, loaded as float32), else float32 (kind F32)."""
    __slots__ = ("kind", "data", "shape")

    def __init__(self, weight: np.ndarray):
        self.shape = weight.shape
        if weight.dtype == np.float16:
            self.kind, self.data = KINDS[F16], np.ascontiguousarray(weight).view(np.uint16)
            return
        weight = np.ascontiguousarray(weight, dtype=np.float32)
        with np.errstate(over="ignore"):
            half = weight.astype(np.float16)
        bits = weight.view(np.uint32)
        if np.array_equal(half.astype(np.float32), weight):
            self.kind, self.data = KINDS[F16], half.view(np.uint16)
        elif not (bits & 0xFFFF).any():  # the low halves all zero: bfloat16 values
            self.kind, self.data = KINDS[BF16], (bits >> 16).astype(np.uint16).view(np.int16)
        else:
            self.kind, self.data = KINDS[F32], weight

    @classmethod
    def of(cls, kind: QuantKind, data: np.ndarray) -> "LinearWeight":
        """One from its held form: kind F16 with float16 bits, BF16 with bfloat16's, or
        F32 with float32."""
        held = cls.__new__(cls)
        held.kind, held.data, held.shape = kind, data, data.shape
        return held

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    @property
    def ndim(self) -> int:
        return 2

    def product(self, x: np.ndarray, ahead=None) -> np.ndarray:
        """x (M, K) float32 @ W.T -> (M, N): numba's GEMV or GEMM for a few rows, BLAS for
        many (the module's docstring says where the line is). ahead: not hinted here."""
        if len(x) > NUMBA_MAX_ROWS or self.shape[0] < GROUP:
            _last_product.blas = True
            if self.kind.code == F32:
                return x @ self.data.T
            return tiled_matmul(x, self.shape[0], lambda first, tile: widen_tile(self.data, first, tile))
        out = np.empty((len(x), self.shape[0]), dtype=np.float32)
        if self.kind.code == F16 and len(x) <= F16_GEMV_MAX_ROWS:
            _gemv_f16(x, self.data, out)
        else:
            gemm_narrow(x, self.data, out)
        return out

    def dequantize(self, rows=slice(None)) -> np.ndarray:
        """float32 (r, K) of the selected rows (embedding lookups)."""
        picked = self.data[rows]
        if self.kind.code == F16:
            return picked.view(np.float16).astype(np.float32)
        if self.kind.code == BF16:
            return (picked.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return picked.copy()


def prepare_linear_weights(weights: dict[str, np.ndarray]) -> dict:
    """The model's weights with every 2-D float matrix (the embedding included) held
    as a LinearWeight; a tied lm_head stays the embedding's own object. Takes the
    dict over (model.weights.convert_matrices)."""
    return convert_matrices(weights, lambda w: LinearWeight(w)
                            if isinstance(w, np.ndarray) and w.ndim == 2 else None)


def linear(x: np.ndarray, weight, bias: np.ndarray | None = None, ahead=None) -> np.ndarray:
    """x (T, K) @ weight.T (+ bias) -> (T, N): the weight's own product (LinearWeight,
    LanePacked and StackRows each have one); ahead: as reference.linear's."""
    _last_product.blas = False  # (a LinearWeight's product says when it takes BLAS)
    out = weight.product(np.ascontiguousarray(x, dtype=np.float32), ahead)
    return out if bias is None else out + bias

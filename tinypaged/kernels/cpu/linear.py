"""CPU matrix products: a numba float16-weight GEMV for decode, BLAS for the rest.

Decode reads every weight once per step for a handful of rows, so it is bound by
memory bandwidth: weights are kept a second time as float16 bit patterns (half
the bytes) and a numba kernel streams each row once, widening it with the CPU's
half->float instruction (F16C) and accumulating in float32. Prefill and large
batches are bound by arithmetic instead, and there BLAS on the float32 copy wins.

The two paths never alternate within a step's layers: numba's OpenMP workers and
OpenBLAS's threads both spin after their work, and interleaving them on two cores
costs milliseconds per switch.
"""
import numpy as np
from numba import float32, njit, prange

from ...model.packed import PackedWeight
from .common import N_CHUNKS, f16_bits_to_f32
from .quantized import gemv_packed, matmul_packed

GEMV_MAX_ROWS = 4  # up to this many rows of x take the float16 / packed decode path


@njit(parallel=True, fastmath=True, cache=True)
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
    """A weight matrix (N, K) as the CPU paths read it: transposed float32 (K, N) for
    BLAS (x @ W.T as a plain NN product is 5-20% faster here than with a transposed
    operand), plus its float16 bits (N, K) when float16 holds it exactly (weights
    stored as F16, as our GGUF conversion writes them), so both paths compute with
    the same numbers."""
    __slots__ = ("f32_t", "f16_bits", "shape")

    def __init__(self, weight: np.ndarray):
        weight = np.asarray(weight, dtype=np.float32)
        self.shape = weight.shape
        self.f32_t = np.ascontiguousarray(weight.T)  # (K, N)
        with np.errstate(over="ignore"):
            half = np.ascontiguousarray(weight.astype(np.float16))
        exact = np.array_equal(half.astype(np.float32), weight)
        self.f16_bits = half.view(np.uint16) if exact else None

    @property
    def nbytes(self) -> int:
        return self.f32_t.nbytes + (self.f16_bits.nbytes if self.f16_bits is not None else 0)


def prepare_linear_weights(weights: dict[str, np.ndarray]) -> dict:
    """The model's weights with every 2-D matrix wrapped as a LinearWeight."""
    out = dict(weights)
    for name, w in weights.items():
        if w.ndim == 2 and name != "model.embed_tokens.weight" and not isinstance(w, PackedWeight):
            out[name] = LinearWeight(w)
    return out


def linear(x: np.ndarray, weight, bias: np.ndarray | None = None) -> np.ndarray:
    """x (T, K) @ weight.T (+ bias) -> (T, N); weight a LinearWeight, a PackedWeight
    (quantized) or a float32 array."""
    if isinstance(weight, PackedWeight):
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = gemv_packed(x, weight) if len(x) <= GEMV_MAX_ROWS else matmul_packed(x, weight)
    elif isinstance(weight, LinearWeight):
        if weight.f16_bits is not None and len(x) <= GEMV_MAX_ROWS:
            out = np.empty((len(x), weight.shape[0]), dtype=np.float32)
            _gemv_f16(np.ascontiguousarray(x, dtype=np.float32), weight.f16_bits, out)
        else:
            out = x @ weight.f32_t
    else:
        out = x @ weight.T
    return out if bias is None else out + bias

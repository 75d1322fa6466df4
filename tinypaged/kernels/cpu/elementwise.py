"""CPU kernels (numba.njit) for the per-token ops: RMSNorm (+ residual add), RoPE, SiLU-mul.

These are O(T * H) and memory-light next to the matmuls; they run single-threaded
(numba's parallel launch costs more than the work at decode batch sizes).
"""
import numpy as np
from numba import float32, njit

from ...jit_cache import cached_njit
from .common import kv_narrow
from .fast_exp import exp32


@cached_njit(fastmath=True)
def _rms_norm(x, weight, eps, out):
    """out = rms_norm(x): the row's scale in float64 (Gemma 3's perplexity moves 0.2%
    with a float32 one), the row's products in float32 (as float64 they took 2.3x)."""
    n_tokens, hidden = x.shape
    for t in range(n_tokens):
        ss = float32(0.0)
        for i in range(hidden):
            ss += x[t, i] * x[t, i]
        scale = float32(1.0 / np.sqrt(ss / hidden + eps))  # (float64 once a row; a float32 row)
        for i in range(hidden):
            out[t, i] = x[t, i] * scale * weight[i]


def rms_norm(x, weight, eps):
    """x (T, H) * rsqrt(mean(x^2) + eps) * weight (H,)."""
    out = np.empty_like(x)
    _rms_norm(x, weight, eps, out)
    return out


@cached_njit(fastmath=True)
def _add_rms_norm(x, residual, weight, eps, out):
    """residual += x (in place), out = rms_norm(residual): one pass over each row."""
    n_tokens, hidden = x.shape
    for t in range(n_tokens):
        ss = float32(0.0)
        for i in range(hidden):
            r = residual[t, i] + x[t, i]
            residual[t, i] = r
            ss += r * r
        scale = float32(1.0 / np.sqrt(ss / hidden + eps))  # (float64 once a row; a float32 row)
        for i in range(hidden):
            out[t, i] = residual[t, i] * scale * weight[i]


def add_rms_norm(x, residual, weight, eps):
    """(rms_norm(x + residual), x + residual); residual None means x alone. The
    residual array is updated in place (it is the step's own buffer)."""
    if residual is None:
        return rms_norm(x, weight, eps), x
    out = np.empty_like(x)
    _add_rms_norm(x, residual, weight, eps, out)
    return out, residual


@njit(fastmath=True, inline="always")
def rope_row(x, cos, sin, out):
    """One head's row x (D,) rotated by a position's cos, sin (D/2,) into out (a row of
    float32, or of a float16 KV pool's bits: kv_narrow rounds for it)."""
    half = x.shape[0] // 2
    for i in range(half):
        a, b = x[i], x[i + half]
        out[i] = kv_narrow(a * cos[i] - b * sin[i], out)  # rotate-half: pair (i, i + D/2)
        out[i + half] = kv_narrow(b * cos[i] + a * sin[i], out)


@cached_njit(fastmath=True)
def _rope(x, positions, cos_table, sin_table, out):
    for t in range(x.shape[0]):
        p = positions[t]
        for h in range(x.shape[1]):
            rope_row(x[t, h], cos_table[p], sin_table[p], out[t, h])


def rope(x, positions, cos_table, sin_table):
    """x (T, heads, D) rotated by the angles of positions (T,), tables (max_pos, D/2)."""
    out = np.empty_like(x)
    _rope(x, positions, cos_table, sin_table, out)
    return out


@njit(inline="always")
def _silu_times(g, u):
    return g / (float32(1.0) + exp32(-g)) * u


_GELU_2C = float32(2.0 * np.sqrt(2.0 / np.pi))


@njit(inline="always")
def _gelu_tanh_times(g, u):
    """0.5 * g * (1 + tanh(v)) * u, v = sqrt(2/pi) (g + 0.044715 g^3), written as
    g * u / (1 + e^(-2v)) (the same function, with no tanh call to vectorise)."""
    two_v = _GELU_2C * (g + float32(0.044715) * g * g * g)
    return g * u / (float32(1.0) + exp32(-two_v))


# error_model="numpy": a float division by zero gives inf, as in NumPy, instead of a
# Python exception checked per element, which keeps LLVM from vectorising the loop
@cached_njit(fastmath=True, error_model="numpy")
def _silu_mul(gate, up, out):
    n_tokens, width = gate.shape
    for t in range(n_tokens):
        for i in range(width):
            out[t, i] = _silu_times(gate[t, i], up[t, i])


@cached_njit(fastmath=True, error_model="numpy")
def _gelu_tanh_mul(gate, up, out):
    n_tokens, width = gate.shape
    for t in range(n_tokens):
        for i in range(width):
            out[t, i] = _gelu_tanh_times(gate[t, i], up[t, i])


def gelu_tanh_mul(gate, up):
    """gelu_tanh(gate) * up, both (T, I) (reference.gelu_tanh_mul)."""
    out = np.empty_like(gate)
    _gelu_tanh_mul(gate, up, out)
    return out


@cached_njit(fastmath=True, error_model="numpy")
def _gelu_tanh_mul_halves(gate_up, out):
    n_tokens, width = out.shape
    for t in range(n_tokens):
        for i in range(width):
            out[t, i] = _gelu_tanh_times(gate_up[t, i], gate_up[t, width + i])


def gelu_tanh_mul_halves(gate_up):
    """gelu_tanh_mul of gate_up (T, 2 I)'s halves, read in place."""
    return _of_halves(_gelu_tanh_mul_halves, gate_up)


def silu_mul(gate, up):
    """silu(gate) * up, both (T, I)."""
    out = np.empty_like(gate)
    _silu_mul(gate, up, out)
    return out


@cached_njit(fastmath=True, error_model="numpy")
def _silu_mul_halves(gate_up, out):
    n_tokens, width = out.shape
    for t in range(n_tokens):
        for i in range(width):
            out[t, i] = _silu_times(gate_up[t, i], gate_up[t, width + i])


def _of_halves(kernel, gate_up):
    """kernel(gate_up, out): out (T, I) of gate_up (T, 2 I)'s halves, read in place
    (strided views of them compile to a loop 5x slower; copies of them cost a layer
    ~0.1 ms at 32 rows)."""
    out = np.empty((gate_up.shape[0], gate_up.shape[1] // 2), gate_up.dtype)
    kernel(gate_up, out)
    return out


def silu_mul_halves(gate_up):
    """silu_mul of gate_up (T, 2 I)'s halves, read in place."""
    return _of_halves(_silu_mul_halves, gate_up)

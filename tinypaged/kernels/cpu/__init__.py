"""The CPU backend: numba.njit kernels; large matrix products through NumPy's BLAS.
LANES.md explains the packed products' layout and IR writers, with a worked block."""
import numpy as np

# NumPy is already the right tool for these: slicing, fancy indexing, host arrays
from ..reference import (add, copy_blocks, default_kv_memory, embedding, gather_rows, scale, softcap,
                         logits_for_sampling, memory_available, prepare_inputs, rope_tables,
                         use_in_this_thread)
from .elementwise import add_rms_norm as norm_for_products  # (nothing to fold it into here)
from .attention import paged_attention
from .cache_ops import allocate_kv, rope_write_kv, write_kv
from . import elementwise
from .elementwise import add_rms_norm, gelu_tanh_mul_halves, rms_norm, rope, silu_mul_halves
from .lane_packed import lay_out_weights
from .linear import linear, prepare_linear_weights
from .lora import add_lora, lora_groups, lora_stacks, upload
from .out_arrays import from_pool, step_workspace
from .stacks import stack_layer_matrices, stacked_linear, whole_stack
from .views_ir import are_halves
from .weight_cache import load_prepared_weights, save_prepared_weights

name = "cpu"
kv_cache_dtypes = ("float32", "float16", "int8")  # the pools this backend holds
__all__ = ["name", "use_in_this_thread", "default_kv_memory", "memory_available", "prepare_weights", "load_prepared_weights", "save_prepared_weights", "allocate_kv",
           "prepare_inputs", "step_workspace", "to_host", "logits_for_sampling", "rope_tables", "embedding", "add_rms_norm", "norm_for_products", "rms_norm", "linear",
           "qkv_proj", "gate_up_silu", "rope_write_kv", "paged_attention", "silu_mul",
           "gather_rows", "copy_blocks", "write_kv", "rope", "scale", "add", "gate_up_gelu", "softcap", "upload", "add_lora", "lora_groups", "lora_stacks", "gate_up"]


def prepare_weights(weights: dict) -> dict:
    """Every float matrix held once (linear.py); each layer's q/k/v and gate/up
    stacked, so each group is one product (stacks.py); every packed matrix laid out
    16 rows to a group for the byte-dot kernels (lanes.py). Takes the dict over."""
    return lay_out_weights(stack_layer_matrices(prepare_linear_weights(weights)))


def to_host(x):
    """x where the caller may keep it: a copy when it came from the step workspace
    (out_arrays.py), which the thread's next step writes over."""
    return np.array(x) if from_pool(x) else x


def qkv_proj(x, wq, wk, wv, bq=None, bk=None, bv=None, ahead=None):
    """The attention's three projections of x: (q, k, v)."""
    q, k, v = stacked_linear(x, [wq, wk, wv], ahead)
    return tuple(out if b is None else out + b for out, b in ((q, bq), (k, bk), (v, bv)))


def gate_up(x, w_gate, w_up, ahead=None):
    """(x @ w_gate.T, x @ w_up.T): the MLP's products before its activation (where
    LoRA terms join them). One product when they are one stack, its halves returned
    as views: a copy of each (a fresh allocation past glibc's mmap threshold, its
    pages faulted in anew) cost ~70 us a layer at 32 rows."""
    whole = whole_stack([w_gate, w_up])
    if whole is None:
        return tuple(stacked_linear(x, [w_gate, w_up], ahead))
    out = linear(x, whole, ahead=ahead)
    return out[:, :w_gate.shape[0]], out[:, w_gate.shape[0]:]


def _whole_of(gate, up):
    """The (T, 2 I) array whose left and right halves gate and up are (gate_up's
    views), else None (the addresses compared in numba: ~1 us each read in Python)."""
    whole = gate.base
    if whole is None or up.base is not whole or whole.ndim != 2 or not whole.flags.c_contiguous \
            or whole.dtype != np.float32 or gate.strides != whole.strides or up.strides != whole.strides:
        return None
    return whole if are_halves(whole, gate, up) else None


def silu_mul(gate, up):
    """silu(gate) * up, both (T, I); gate_up's halves are read in place, as
    gate_up_silu reads them (the same kernel: the same bits)."""
    whole = _whole_of(gate, up)
    return elementwise.silu_mul(gate, up) if whole is None else silu_mul_halves(whole)


def gelu_tanh_mul(gate, up):
    """gelu_tanh(gate) * up, both (T, I); gate_up's halves read in place."""
    whole = _whole_of(gate, up)
    return elementwise.gelu_tanh_mul(gate, up) if whole is None else gelu_tanh_mul_halves(whole)


def gate_up_gelu(x, w_gate, w_up):
    """gelu_tanh(x @ w_gate.T) * (x @ w_up.T) (Gemma's GeGLU)."""
    whole = whole_stack([w_gate, w_up])
    if whole is not None:  # (one product, its halves read in place)
        return gelu_tanh_mul_halves(linear(x, whole))
    return elementwise.gelu_tanh_mul(*stacked_linear(x, [w_gate, w_up]))


def gate_up_silu(x, w_gate, w_up):
    """silu(x @ w_gate.T) * (x @ w_up.T)."""
    whole = whole_stack([w_gate, w_up])
    if whole is not None:  # (one product, its halves read in place)
        return silu_mul_halves(linear(x, whole))
    return elementwise.silu_mul(*stacked_linear(x, [w_gate, w_up]))

"""The CPU backend: numba.njit kernels; large matrix products through NumPy's BLAS."""
from ..reference import copy_blocks, rope_tables  # NumPy slicing / computed once
from .attention import paged_attention
from .cache_ops import write_kv
from .elementwise import rms_norm, rope, silu_mul
from .linear import linear, prepare_linear_weights as prepare_weights

name = "cpu"

__all__ = ["prepare_weights", "linear", "rope_tables", "paged_attention", "copy_blocks", "write_kv", "rms_norm",
           "rope", "silu_mul"]

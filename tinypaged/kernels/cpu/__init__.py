"""The CPU backend: numba.njit kernels; matrix products through NumPy's BLAS."""
from ..reference import linear, rope_tables  # BLAS matmul; tables are computed once
from .attention import paged_attention
from .cache_ops import copy_blocks, write_kv
from .elementwise import rms_norm, rope, silu_mul

name = "cpu"

__all__ = ["linear", "rope_tables", "paged_attention", "copy_blocks", "write_kv", "rms_norm",
           "rope", "silu_mul"]

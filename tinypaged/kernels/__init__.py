"""Backends: modules exposing the same ops (OP_NAMES; reference.py is their executable
spec): cpu/ (numba.njit), cuda/ (numba.cuda), and reference itself. They import
formats/, batch/ and leaves only; the models call them through the backend they are
handed."""
from __future__ import annotations

from ..config import BACKENDS

OP_NAMES = ("use_in_this_thread", "default_kv_memory", "memory_available", "prepare_weights", "load_prepared_weights", "save_prepared_weights", "allocate_kv", "prepare_inputs", "step_workspace", "to_host", "logits_for_sampling", "rope_tables",
            "embedding", "add_rms_norm", "norm_for_products", "linear", "qkv_proj", "gate_up_silu", "rope_write_kv",
            "paged_attention", "silu_mul", "gather_rows", "copy_blocks", "rms_norm", "scale", "add", "gate_up_gelu", "softcap")




def get_backend(name: str, gpu_weight_dtype: str = "float16"):
    """'cpu', 'cuda', 'reference', or 'auto': CUDA when a GPU is usable, else the CPU."""
    if name not in BACKENDS:
        raise ValueError(f"backend={name!r} is not one of {BACKENDS}")
    if name == "reference":
        from . import reference
        return reference
    if name in ("auto", "cuda"):
        if _gpu_present() or name == "cuda":
            try:
                from .cuda import cuda_simulated, cuda_usable
                usable = cuda_usable() or (name == "cuda" and cuda_simulated())
            except ImportError:  # numba-cuda is not installed
                usable = False
            if usable:
                from .cuda.backend import CudaBackend
                return CudaBackend(gpu_weight_dtype)
            if name == "cuda":
                raise ValueError("backend='cuda' needs an NVIDIA GPU with a working driver, "
                                 "and numba.cuda finds none (install the 'cuda' extra: "
                                 "pip install -e '.[cuda]')")
    from . import cpu
    return cpu


def _gpu_present() -> bool:
    """Cheap check before importing numba.cuda (which costs a second): a driver device node."""
    import os
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")

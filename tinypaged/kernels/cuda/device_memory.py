"""DeviceMemory: what the CUDA backend keeps on the device across steps: the weights
(uploaded once: matrices as DeviceFloat or DevicePacked, norms and the embedding
table as float32), the KV pool (one allocation), the RoPE tables; and what memory
is left for the pool."""
from __future__ import annotations

import math

import numpy as np
from numba import config, cuda

from ...formats.packed import PackedWeight
from ..kv_q8 import KV_INT8, row_width
from ..reference import rope_tables as host_rope_tables
from .device_weights import DeviceFloat, DevicePacked
from .kv_rows import MAX_HEAD_DIM, Q8Pool
from .toolkit import prepare_compiler

EMBEDDING = "model.embed_tokens.weight"
WORKSPACE_RESERVE = 2 << 30  # bytes kept out of the KV pool for step activations


def free_device_memory() -> int:
    """Bytes free on the device now. The simulator reports infinite memory; its
    "device" arrays live in host RAM, so that is what it has."""
    free, _ = cuda.current_context().get_memory_info()
    if not math.isfinite(free):
        from ...config import available_memory_bytes
        return available_memory_bytes()
    return int(free)


class DeviceMemory:
    def __init__(self, weight_dtype=np.float16):
        if np.dtype(weight_dtype) not in (np.float16, np.float32):
            raise ValueError(f"weight_dtype={weight_dtype!r} must be float16 or float32")
        self.weight_dtype = np.dtype(weight_dtype)
        if not config.ENABLE_CUDASIM:
            prepare_compiler()  # NVVM found before the first kernel compiles
        # where the weights and the pool live (the simulator's one device has no id)
        self.device_id = getattr(cuda.get_current_device(), "id", 0)
        self.packed = False  # any matrix uploaded packed (DevicePacked)

    def use_in_this_thread(self) -> None:
        """numba gives a new thread device 0's context: select the device this backend
        was made on (its weights and KV pool are there) before any op runs here."""
        cuda.select_device(self.device_id)

    def default_kv_memory(self, config) -> int:
        """gpu_memory_utilization of the device memory free now (weights are already
        up), less a reserve for the step workspace and metadata."""
        return int(free_device_memory() * config.gpu_memory_utilization) - WORKSPACE_RESERVE

    def memory_available(self) -> int:
        """Device bytes free now, less the step workspace's reserve."""
        return max(0, free_device_memory() - WORKSPACE_RESERVE)

    def prepare_weights(self, weights: dict[str, np.ndarray]) -> dict:
        """Upload once: 2-D matrices as weight_dtype (DeviceFloat), everything else as
        float32. A tied lm_head gets its own copy in weight_dtype (the embedding table
        stays float32 for the gather). Packed (quantized) matrices go up packed
        (DevicePacked), and their products round x to int8 blocks first, as on every
        backend (reference.round_activations); a packed embedding table is widened."""
        out = {}
        for name, w in weights.items():
            if isinstance(w, PackedWeight) and name != EMBEDDING:
                out[name] = DevicePacked(w)
                self.packed = True
                continue
            if isinstance(w, PackedWeight):
                w = w.dequantize()
            if w.ndim == 2 and name != EMBEDDING:
                out[name] = DeviceFloat(w, self.weight_dtype)
            else:
                out[name] = cuda.to_device(np.ascontiguousarray(w, dtype=np.float32))
        return out

    def load_prepared_weights(self, source) -> None:
        return None  # the device copies are made from the host weights each load

    def save_prepared_weights(self, source, weights: dict) -> None:
        pass

    def allocate_kv(self, shape: tuple[int, ...], dtype=np.float32):
        """One device allocation holding K and V: (2, n_layers, num_blocks, block_size, n_kv, D),
        float32 or float16 (the kernels widen on read, round on write); int8: kv_q8.py's
        rows in place of the D values, K and V each a Q8Pool (kv_rows.py)."""
        if shape[-1] > MAX_HEAD_DIM:
            raise ValueError(f"head_dim={shape[-1]} exceeds the CUDA kernels' MAX_HEAD_DIM={MAX_HEAD_DIM}")
        dtype = np.dtype(dtype)
        if dtype == KV_INT8:
            self.kv_pool = cuda.device_array((2, *shape[:-1], row_width(shape[-1])), dtype=dtype)
            return Q8Pool(self.kv_pool[0]), Q8Pool(self.kv_pool[1])
        self.kv_pool = cuda.device_array((2, *shape), dtype=dtype)
        return self.kv_pool[0], self.kv_pool[1]

    def upload(self, x: np.ndarray):
        """A host array where the kernels read it: a device copy (C-contiguous; LoRA's
        stacks are strided views of their slot-major buffers on the host)."""
        return cuda.to_device(np.ascontiguousarray(x))

    def rope_tables(self, max_positions: int, head_dim: int, rope):
        cos, sin = host_rope_tables(max_positions, head_dim, rope)
        return cuda.to_device(cos), cuda.to_device(sin)

"""CudaBackend: the backend interface on numba.cuda kernels and device memory.

Weights go up once (matrices as float16 by default, norms and the embedding
table as float32). The KV pool is one device allocation. Each step's token ids
and metadata go up in one transfer; activations live in a step workspace; only
the logits of the rows that sample come back.
"""
from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext

import numpy as np
from numba import config, cuda

from ...batch.step_logits import WHOLE_ROW
from ...formats.packed import PackedWeight
from ...formats.quant_kind import QK
from ..reference import rope_tables as host_rope_tables
from . import attention, elementwise, matmul
from .device_weights import DeviceFloat, DevicePacked
from .logits import DeviceLogits, LogitsCopier
from .memory import MetadataUploader, StepWorkspace
from .toolkit import prepare_compiler


EMBEDDING = "model.embed_tokens.weight"
WORKSPACE_RESERVE = 2 << 30  # bytes kept out of the KV pool for step activations


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def free_device_memory() -> int:
    """Bytes free on the device now. The simulator reports infinite memory; its
    "device" arrays live in host RAM, so that is what it has."""
    free, _ = cuda.current_context().get_memory_info()
    if not math.isfinite(free):
        from ...config import available_memory_bytes
        return available_memory_bytes()
    return int(free)


class CudaBackend:
    name = "cuda"

    def __init__(self, weight_dtype=np.float16):
        if np.dtype(weight_dtype) not in (np.float16, np.float32):
            raise ValueError(f"weight_dtype={weight_dtype!r} must be float16 or float32")
        self.weight_dtype = np.dtype(weight_dtype)
        if not config.ENABLE_CUDASIM:
            prepare_compiler()  # NVVM found before the first kernel compiles
        # where the weights and the pool live (the simulator's one device has no id)
        self.device_id = getattr(cuda.get_current_device(), "id", 0)
        self.workspace = StepWorkspace()
        self.uploader = MetadataUploader()
        self._no_bias = cuda.device_array(1, dtype=np.float32)
        self.launches = 0  # kernel launches from the host so far (a recording's first run,
        #   and a replay without a graph, too)
        self.replays = 0  # recorded steps run again
        self.graph_launches = 0  # of those, the ones launched as one CUDA graph (on a GPU)
        self.transfers = 0  # host <-> device copies of step inputs, logits and CoW pairs
        self._recording = None  # the StepRecording that launches are added to, if any
        self._pairs = None  # device buffer for copy-on-write pairs
        self._packed = False  # any matrix uploaded packed: norms also write their output rounded
        self._no_round = cuda.device_array((1, 1), dtype=np.float32)  # placeholder output
        self._rounded = {}  # id(norm output) -> (it, it rounded), this step's
        self.logits_copier = LogitsCopier(self)  # the logits' way back, its buffers reused
        self.reduce_logits = True  # samples take candidates found here, not whole rows
        self.bytes_to_host = 0  # of logits and candidates copied back

    def use_in_this_thread(self) -> None:
        """numba gives a new thread device 0's context: select the device this backend
        was made on (its weights and KV pool are there) before any op runs here."""
        cuda.select_device(self.device_id)

    # -- moving data ---------------------------------------------------------------
    def default_kv_memory(self, config) -> int:
        """gpu_memory_utilization of the device memory free now (weights are already
        up), less a reserve for the step workspace and metadata."""
        return int(free_device_memory() * config.gpu_memory_utilization) - WORKSPACE_RESERVE

    def memory_available(self) -> int:
        """Device bytes free now, less the step workspace's reserve."""
        return max(0, free_device_memory() - WORKSPACE_RESERVE)

    def prepare_weights(self, weights: dict[str, np.ndarray]) -> dict:
        """Upload once: 2-D matrices as weight_dtype, everything else as float32. A tied
        lm_head gets its own copy in weight_dtype (the embedding table stays float32
        for the gather). Packed (quantized) matrices go up packed (DevicePacked), and
        their products round x to int8 blocks first, as on every backend
        (reference.round_activations); a packed embedding table is widened."""
        out = {}
        for name, w in weights.items():
            if isinstance(w, PackedWeight) and name != EMBEDDING:
                out[name] = DevicePacked(w)
                self._packed = True
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
        float32 or float16 (the kernels widen on read, round on write)."""
        self.kv_pool = cuda.device_array((2, *shape), dtype=np.dtype(dtype))
        return self.kv_pool[0], self.kv_pool[1]

    def prepare_inputs(self, token_ids: np.ndarray, meta):
        self.workspace.reset()
        self._rounded.clear()
        self.transfers += 1
        return self.uploader.upload(token_ids, meta, attention.Q_TILE, attention.PARTITION)

    def step_workspace(self):
        """(The device's step workspace is reset by prepare_inputs: memory.py.)"""
        return nullcontext()

    def to_host(self, x) -> np.ndarray:
        self.transfers += 1
        return x.copy_to_host()

    def logits_for_sampling(self, logits, needs: list[int]):
        """The step's logits stay here; only what sampling needs comes back (logits.py).
        reduce_logits False: whole rows for every sample (the reference for tests)."""
        if not self.reduce_logits:
            needs = [WHOLE_ROW if need > 0 else need for need in needs]
        return DeviceLogits(self.logits_copier, logits, needs)

    @contextmanager
    def recording(self, recording):
        """Within: every launch also goes into `recording` (cleared first), and
        activations come from the recording's own workspace, so the arrays its
        launches name stay theirs."""
        assert self._recording is None, "recordings do not nest"
        recording.clear()
        recording.workspace.reset()
        self._rounded.clear()
        eager_workspace, self.workspace, self._recording = self.workspace, recording.workspace, recording
        try:
            yield recording
        finally:
            self.workspace, self._recording = eager_workspace, None

    def rope_tables(self, max_positions: int, head_dim: int, rope):
        cos, sin = host_rope_tables(max_positions, head_dim, rope)
        return cuda.to_device(cos), cuda.to_device(sin)

    def _empty(self, *shape):
        return self.workspace.take(shape)

    def _launch(self, kernel, grid, block, *args):
        self.launches += 1
        if self._recording is not None:
            self._recording.add(kernel, grid, block, args)
        kernel[grid, block](*args)

    # -- ops -------------------------------------------------------------------------
    def embedding(self, token_ids, table):
        out = self._empty(len(token_ids), table.shape[1])
        self._launch(elementwise.gather_rows, len(token_ids), elementwise.ROW_THREADS,
                     table, token_ids, out)
        return out

    def gather_rows(self, x, indices):
        out = self._empty(len(indices), x.shape[1])
        self._launch(elementwise.gather_rows, len(indices), elementwise.ROW_THREADS, x, indices, out)
        return out

    def add_rms_norm(self, x, residual, weight, eps):
        """With packed matrices, the norm also writes its output rounded (the form their
        products take), so that no round_activations launch precedes them."""
        out = self._empty(*x.shape)
        has_residual = residual is not None
        do_round = self._packed and x.shape[1] % QK == 0
        rounded = self._empty(*x.shape) if do_round else self._no_round
        self._launch(elementwise.add_rms_norm, x.shape[0], elementwise.NORM_THREADS,
                     x, residual if has_residual else x, has_residual, weight, np.float32(eps),
                     out, rounded, do_round)
        if do_round:
            self._rounded[id(out)] = (out, rounded)
        return out, (residual if has_residual else x)

    def rms_norm(self, x, weight, eps):
        return self.add_rms_norm(x, None, weight, eps)[0]

    def softcap(self, x, cap):
        return self._elementwise(elementwise.softcap, x, np.float32(cap))

    def scale(self, x, factor):
        return self._elementwise(elementwise.scale, x, np.float32(factor))

    def add(self, x, y):
        return self._elementwise(elementwise.add, x, y)

    def _elementwise(self, kernel, x, *args):
        """kernel(x, *args, out) over x's (T, H) elements, 256 threads a block: out."""
        out = self._empty(*x.shape)
        self._launch(kernel, ceil_div(x.shape[0] * x.shape[1], 256), 256, x, *args, out)
        return out

    def _input_for(self, x, weight):
        """x, or x rounded to int8 blocks when weight's products take it so (a packed
        kind, on every backend): the norm's rounded output when x is a norm's."""
        if not weight.rounds_x:
            return x
        known = self._rounded.get(id(x))
        return known[1] if known is not None and known[0] is x else self.round_activations_of(x)

    def round_activations_of(self, x):
        """x (M, K) as products with packed weights take it (reference.round_activations)."""
        out = self._empty(*x.shape)
        n_blocks = x.shape[0] * x.shape[1] // QK
        self._launch(elementwise.round_activations, ceil_div(n_blocks, elementwise.ROUND_THREADS),
                     elementwise.ROUND_THREADS, x, out)
        return out

    def linear(self, x, weight, bias=None):
        return self._product(self._input_for(x, weight), weight, bias)

    def _product(self, x, weight, bias=None):
        out = self._empty(x.shape[0], weight.shape[0])
        has_bias = bias is not None
        weight.product(self._launch, x, bias if has_bias else self._no_bias, has_bias, out)
        return out

    def qkv_proj(self, x, wq, wk, wv, bq=None, bk=None, bv=None):
        if not wq.fuses_with(wk, wv) or wq.kernels.qkv is None:
            return self.linear(x, wq, bq), self.linear(x, wk, bk), self.linear(x, wv, bv)
        x = self._input_for(x, wq)
        if x.shape[0] > matmul.GEMV_MAX_ROWS:
            return self._product(x, wq, bq), self._product(x, wk, bk), self._product(x, wv, bv)
        outs = tuple(self._empty(x.shape[0], w.shape[0]) for w in (wq, wk, wv))
        has_bias = bq is not None
        wq.qkv(self._launch, x, wk, wv, (bq, bk, bv) if has_bias else (self._no_bias,) * 3, has_bias, outs)
        return outs

    def gate_up_silu(self, x, w_gate, w_up):
        if not w_gate.fuses_with(w_up):
            return self.silu_mul(self.linear(x, w_gate), self.linear(x, w_up))
        x = self._input_for(x, w_gate)
        if x.shape[0] > matmul.GEMV_MAX_ROWS:
            return self.silu_mul(self._product(x, w_gate), self._product(x, w_up))
        out = self._empty(x.shape[0], w_gate.shape[0])
        w_gate.gate_up_silu(self._launch, x, w_up, out)
        return out

    def rope_write_kv(self, q, k, v, positions, cos_table, sin_table, k_cache, v_cache,
                      slot_mapping):
        grid = (q.shape[0], q.shape[1] + k.shape[1])
        self._launch(elementwise.rope_write_kv, grid, max(1, q.shape[2] // 2),
                     q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping)
        return q  # rotated in place

    def paged_attention(self, q, k_cache, v_cache, meta, window=None, scores_scale=None,
                        softcap=None):
        if q.shape[2] > attention.MAX_HEAD_DIM:
            raise ValueError(f"head_dim={q.shape[2]} exceeds the CUDA kernels' "
                             f"MAX_HEAD_DIM={attention.MAX_HEAD_DIM}")
        out = self._empty(*q.shape)
        scale = np.float32(1.0 / np.sqrt(q.shape[2]) if scores_scale is None else scores_scale)
        args = (q, k_cache, v_cache, meta.block_tables, meta.positions, meta.token_seq)
        window = np.int32(window or 0)  # 0: no sliding window
        cap = np.float32(softcap or 0.0)  # 0: no soft-capping
        if meta.num_decode:
            self._decode_attention(args, meta, scale, window, cap, out)
        if meta.num_tiles:
            self._launch(attention.paged_attention_prefill, (meta.num_tiles, q.shape[1]),
                         attention.PREFILL_THREADS, *args, meta.prefill_tiles, scale, window, cap,
                         out)
        return out

    def _decode_attention(self, args, meta, scale, window, cap, out):
        """Split-K decode: a block per (row, KV head, partition of attention.PARTITION
        keys), all of a partition's keys loaded at once; partitions merged by
        log-sum-exp when there are several."""
        q, k_cache = args[0], args[1]
        n_rows, n_heads, head_dim = meta.num_decode, q.shape[1], q.shape[2]
        group = n_heads // k_cache.shape[2]
        if group > attention.MAX_GROUP:
            raise ValueError(f"a GQA group of {group} query heads per KV head exceeds the "
                             f"decode kernel's MAX_GROUP={attention.MAX_GROUP}")
        parts = meta.decode_partitions
        # (one partition writes out directly; the partials are then placeholders)
        part_acc = self._empty(n_rows, n_heads, parts, head_dim) if parts > 1 else self._empty(1, 1, 1, 1)
        part_ml = self._empty(n_rows, n_heads, parts, 2) if parts > 1 else self._empty(1, 1, 1, 2)
        self._launch(attention.paged_attention_decode, (n_rows, k_cache.shape[2], parts),
                     attention.DECODE_THREADS, *args, meta.decode_rows, scale, window, cap,
                     part_acc, part_ml, out)
        if parts > 1:
            self._launch(attention.merge_partitions, (n_rows, n_heads), attention.MERGE_THREADS,
                         meta.positions, meta.decode_rows, window, part_acc, part_ml, out)

    def gate_up_gelu(self, x, w_gate, w_up):
        """Gemma's GeGLU: two products, then gelu_tanh(gate) * up."""
        return self._elementwise(elementwise.gelu_tanh_mul, self.linear(x, w_gate),
                                 self.linear(x, w_up))

    def silu_mul(self, gate, up):
        return self._elementwise(elementwise.silu_mul, gate, up)

    def copy_blocks(self, k_pool, v_pool, pairs):
        """Copy-on-write copies: the (src, dst) pairs go up in a small reused buffer."""
        pairs = np.asarray(pairs, dtype=np.int32).reshape(-1, 2)
        if self._pairs is None or self._pairs.shape[0] < len(pairs):
            self._pairs = cuda.device_array((max(64, 2 * len(pairs)), 2), dtype=np.int32)
        pairs_dev = self._pairs[:len(pairs)]
        pairs_dev.copy_to_device(pairs)
        self.transfers += 1
        self._launch(elementwise.copy_blocks, (len(pairs), k_pool.shape[0]), elementwise.ROW_THREADS,
                     k_pool, v_pool, pairs_dev)

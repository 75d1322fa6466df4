"""CudaBackend: the backend interface on numba.cuda kernels and device memory.

Weights, the KV pool and the RoPE tables live on the device (device_memory.py); each
step's token ids and metadata go up in one transfer; activations are carved from the
launcher's step workspace (launcher.py, which also records a decode step for replay
and counts); only what sampling needs of the logits comes back (logits.py).
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext

import numpy as np
from numba import cuda

from ...batch.step_logits import WHOLE_ROW
from ...formats.quant_kind import QK
from . import attention, elementwise, kv_rows, lora, matmul, prefill_attention
from .device_memory import DeviceMemory
from .launcher import Launcher
from .logits import DeviceLogits, LogitsCopier
from .memory import MetadataUploader
from .normed_rows import NormedRows, rows_of


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class CudaBackend(DeviceMemory):
    name = "cuda"
    kv_cache_dtypes = ("float32", "float16", "int8")  # (the kernels read these pools: kv_rows.py)

    def __init__(self, weight_dtype=np.float16):
        super().__init__(weight_dtype)
        self.launcher = Launcher()
        self.uploader = MetadataUploader()
        self._no_bias = cuda.device_array(1, dtype=np.float32)
        self._pairs = None  # device buffer for copy-on-write pairs
        self._no_round = cuda.device_array((1, 1), dtype=np.float32)  # placeholder output
        self._last_norm = None  # (the last norm's output, it rounded): what its products take
        self.logits_copier = LogitsCopier(self.launcher)  # the logits' way back, buffers reused
        self.reduce_logits = True  # samples take candidates found here, not whole rows

    def prepare_inputs(self, token_ids: np.ndarray, meta):
        self.launcher.new_step()
        self._last_norm = None
        return self.uploader.upload(token_ids, meta, prefill_attention.Q_TILE, attention.MIN_DECODE_KEYS)

    def step_workspace(self):
        """(The device's step workspace is reset by prepare_inputs: launcher.py.)"""
        return nullcontext()

    def to_host(self, x) -> np.ndarray:
        self.launcher.settle()
        self.launcher.transfers += 1
        return rows_of(x).copy_to_host()

    def logits_for_sampling(self, logits, needs: list[int]):
        """The step's logits stay here; only what sampling needs comes back (logits.py).
        reduce_logits False: whole rows for every sample (the reference for tests)."""
        if not self.reduce_logits:
            needs = [WHOLE_ROW if need > 0 else need for need in needs]
        return DeviceLogits(self.logits_copier, logits, needs)

    @contextmanager
    def recording(self, recording):
        """Within: the launcher records into `recording` (Launcher.recording)."""
        self._last_norm = None
        with self.launcher.recording(recording):
            yield recording

    def _empty(self, *shape):
        return self.launcher.empty(*shape)

    # -- ops -------------------------------------------------------------------------
    def embedding(self, token_ids, table):
        return self.gather_rows(table, token_ids)

    def gather_rows(self, x, indices):
        out = self._empty(len(indices), x.shape[1])
        self.launcher(elementwise.gather_rows, len(indices), elementwise.ROW_THREADS, x, indices, out)
        return out

    def add_rms_norm(self, x, residual, weight, eps):
        """With packed matrices, the norm also writes its output rounded (the form their
        products take), so that no round_activations launch precedes them."""
        out = self._empty(*x.shape)
        has_residual = residual is not None
        do_round = self.packed and x.shape[1] % QK == 0
        rounded = self._empty(*x.shape) if do_round else self._no_round
        self.launcher(elementwise.add_rms_norm, x.shape[0], elementwise.NORM_THREADS,
                      x, residual if has_residual else x, has_residual, weight, np.float32(eps),
                      out, residual if has_residual else x, rounded, do_round)
        self._last_norm = (out, rounded) if do_round else None
        return out, (residual if has_residual else x)

    def norm_for_products(self, x, residual, weight, eps):
        """add_rms_norm whose output goes to products only: with float matrices and
        decode rows, NormedRows, which their GEMVs fold in (normed_rows.py)."""
        if self.packed or x.shape[0] > matmul.NORMED_MAX_ROWS:
            return self.add_rms_norm(x, residual, weight, eps)
        normed = NormedRows(self.launcher, x, residual, weight, eps)
        return normed, normed.residual_out

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
        self.launcher(kernel, ceil_div(x.shape[0] * x.shape[1], 256), 256, x, *args, out)
        return out

    def _input_for(self, x, weight):
        """x, or x rounded to int8 blocks when weight's products take it so (a packed
        kind, on every backend): the norm's rounded output when x is a norm's."""
        if not weight.rounds_x:
            return x  # (NormedRows too: the weight's product folds it or writes it)
        x = rows_of(x)
        last = self._last_norm  # (a norm's products follow it directly)
        return last[1] if last is not None and last[0] is x else self.round_activations_of(x)

    def round_activations_of(self, x):
        """x (M, K) as products with packed weights take it (reference.round_activations)."""
        out = self._empty(*x.shape)
        n_blocks = x.shape[0] * x.shape[1] // QK
        self.launcher(elementwise.round_activations, ceil_div(n_blocks, elementwise.ROUND_THREADS),
                      elementwise.ROUND_THREADS, x, out)
        return out

    def linear(self, x, weight, bias=None, ahead=None):  # (ahead: host bytes, not hinted here)
        return self._product(self._input_for(x, weight), weight, bias)

    def _product(self, x, weight, bias=None):
        out = self._empty(x.shape[0], weight.shape[0])
        has_bias = bias is not None
        weight.product(self.launcher, x, bias if has_bias else self._no_bias, has_bias, out)
        return out

    def qkv_proj(self, x, wq, wk, wv, bq=None, bk=None, bv=None, ahead=None):
        if not wq.fuses_with(wk, wv):
            return self.linear(x, wq, bq), self.linear(x, wk, bk), self.linear(x, wv, bv)
        x = self._input_for(x, wq)
        outs = tuple(self._empty(x.shape[0], w.shape[0]) for w in (wq, wk, wv))
        has_bias = bq is not None
        wq.qkv(self.launcher, x, wk, wv, (bq, bk, bv) if has_bias else (self._no_bias,) * 3, has_bias, outs)
        return outs

    def gate_up(self, x, w_gate, w_up, ahead=None):
        return self.linear(x, w_gate), self.linear(x, w_up)

    def lora_groups(self, rows, slots):
        return self.upload(rows), self.upload(slots)

    lora_stacks = staticmethod(lora.lora_stacks)

    def add_lora(self, x, ys, stacks, rows, slots):
        lora.add_lora(self.launcher, rows_of(x), ys, stacks, rows, slots)

    def gate_up_silu(self, x, w_gate, w_up):
        if not w_gate.fuses_with(w_up):
            return self.silu_mul(self.linear(x, w_gate), self.linear(x, w_up))
        x = self._input_for(x, w_gate)
        out = self._empty(x.shape[0], w_gate.shape[0])
        w_gate.gate_up_silu(self.launcher, x, w_up, out)
        return out

    def rope_write_kv(self, q, k, v, positions, cos_table, sin_table, k_cache, v_cache,
                      slot_mapping):
        grid = (q.shape[0], q.shape[1] + k.shape[1])
        if kv_rows.pool_form(k_cache) == "q8":
            kernel, threads = kv_rows.rope_write_kv_q8, kv_rows.rope_write_threads(q.shape[2])
        else:
            kernel, threads = elementwise.rope_write_kv, max(1, q.shape[2] // 2)
        self.launcher(kernel, grid, threads, q, k, v, positions, cos_table, sin_table, k_cache,
                      v_cache, slot_mapping)
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
            attention.launch_decode(self.launcher, args, meta, scale, window, cap, out)
        if meta.num_tiles:
            prefill_attention.launch_prefill(self.launcher, args, meta, scale, window, cap, out)
        return out

    def gate_up_gelu(self, x, w_gate, w_up):
        """Gemma's GeGLU: two products, then gelu_tanh(gate) * up."""
        return self._elementwise(elementwise.gelu_tanh_mul, self.linear(x, w_gate),
                                 self.linear(x, w_up))

    def gelu_tanh_mul(self, gate, up):
        return self._elementwise(elementwise.gelu_tanh_mul, gate, up)

    def silu_mul(self, gate, up):
        return self._elementwise(elementwise.silu_mul, gate, up)

    def copy_blocks(self, k_pool, v_pool, pairs):
        """Copy-on-write copies: the (src, dst) pairs go up in a small reused buffer."""
        pairs = np.asarray(pairs, dtype=np.int32).reshape(-1, 2)
        if self._pairs is None or self._pairs.shape[0] < len(pairs):
            self._pairs = cuda.device_array((max(64, 2 * len(pairs)), 2), dtype=np.int32)
        pairs_dev = self._pairs[:len(pairs)]
        pairs_dev.copy_to_device(pairs)
        self.launcher.transfers += 1
        k_pool, v_pool = kv_rows.pool_rows(k_pool), kv_rows.pool_rows(v_pool)
        self.launcher(elementwise.copy_blocks, (len(pairs), k_pool.shape[0]), elementwise.ROW_THREADS,
                      k_pool, v_pool, pairs_dev)

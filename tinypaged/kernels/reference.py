"""NumPy reference ops: the executable spec every backend's kernels are tested against.

Each op computes in the dtype of its inputs (float32, or float64 for oracles).
Shapes: T tokens, H hidden size, n_heads / n_kv query and KV heads, D head_dim.
"""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from ..batch.step_logits import HostLogits
from ..formats.quant_kind import QK
from ..formats.weight import is_packed
from .kv_q8 import KV_INT8, dequantize_rows, quantize_rows, row_width
from .rope import Rope


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x (T, H) * rsqrt(mean(x^2) + eps) * weight (H,)."""
    variance = np.mean(x * x, axis=-1, keepdims=True)  # (T, 1)
    return x / np.sqrt(variance + eps) * weight.astype(x.dtype)


def rope_cos_sin(positions: np.ndarray, head_dim: int, rope: "Rope | float",
                 dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin tables (T, D) for the rotate-half RoPE form (HF Llama). rope: a Rope
    (rope.py: its kind of scaling) or a plain theta."""
    rope = rope if isinstance(rope, Rope) else Rope(float(rope))
    inv_freq = rope.inv_freq(head_dim)  # (D/2,)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # (T, D/2)
    angles = np.concatenate([angles, angles], axis=-1)  # (T, D)
    scale = rope.attention_factor  # YaRN scales cos and sin; 1 otherwise
    return (np.cos(angles) * scale).astype(dtype), (np.sin(angles) * scale).astype(dtype)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x (T, heads, D) rotated: x * cos + rotate_half(x) * sin, rotate_half = [-x2, x1]."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def silu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up, elementwise (the SwiGLU MLP's middle)."""
    return gate / (1.0 + np.exp(-gate)) * up


def gelu_tanh_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu(gate) * up with GELU's tanh form (PyTorch's approximate="tanh"), the
    GeGLU MLP's middle (Gemma)."""
    c = np.asarray(np.sqrt(2.0 / np.pi), dtype=gate.dtype)
    inner = c * (gate + np.asarray(0.044715, gate.dtype) * gate * gate * gate)
    return np.asarray(0.5, gate.dtype) * gate * (1 + np.tanh(inner)) * up


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                     q_positions: np.ndarray, window: int | None = None,
                     softcap: float | None = None) -> np.ndarray:
    """Softmax attention with GQA over a contiguous cache.

    q (T, n_heads, D) at absolute positions q_positions (T,); k, v (S, n_kv, D)
    hold positions 0..S-1. Query t sees keys 0..q_positions[t], or with a sliding
    window W the last W of them (q_positions[t] - W < key position). Returns
    (T, n_heads, D).
    """
    n_tokens, n_heads, head_dim = q.shape
    n_kv = k.shape[1]
    group = n_heads // n_kv  # query heads per KV head
    qg = q.reshape(n_tokens, n_kv, group, head_dim)  # head h uses KV head h // group
    scores = np.einsum("tkgd,skd->kgts", qg, k) / np.sqrt(head_dim).astype(q.dtype)  # (n_kv, group, T, S)
    if softcap is not None:  # Gemma 2: cap * tanh(score / cap)
        cap = np.asarray(softcap, dtype=q.dtype)
        scores = cap * np.tanh(scores / cap)
    key_positions, q_positions = np.arange(k.shape[0])[None, :], np.asarray(q_positions)[:, None]
    visible = key_positions <= q_positions  # (T, S)
    if window is not None:
        visible &= key_positions > q_positions - window
    scores = np.where(visible, scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.einsum("kgts,skd->tkgd", probs, v)  # (T, n_kv, group, D)
    return out.reshape(n_tokens, n_heads, head_dim)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax of logits (..., V), computed stably."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


name = "reference"


kv_cache_dtypes = ("float32", "float16", "int8")  # the pools this backend holds

# -- paged KV cache ops -------------------------------------------------------
# A layer's pool: k_cache, v_cache (num_blocks, block_size, n_kv, D); slot s is
# block s // block_size, offset s % block_size. An int8 pool holds kv_q8.py's rows
# (num_blocks, block_size, n_kv, D + D/16).

def write_kv(k_cache: np.ndarray, v_cache: np.ndarray, k: np.ndarray, v: np.ndarray,
             slot_mapping: np.ndarray) -> None:
    """Store k, v (T, n_kv, D) of T tokens at their slots."""
    block_size = k_cache.shape[1]
    blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
    if k_cache.dtype == KV_INT8:
        k, v = quantize_rows(k), quantize_rows(v)
    k_cache[blocks, offsets] = k
    v_cache[blocks, offsets] = v


def kv_values(cache: np.ndarray) -> np.ndarray:
    """The values a pool holds, (num_blocks, block_size, n_kv, D): an int8 pool's rows
    dequantized, else the pool itself."""
    return dequantize_rows(cache) if cache.dtype == KV_INT8 else cache


def first_key(position: int, window: int | None) -> int:
    """The first key position a query at position attends to (a window of W keys
    ends at the query itself)."""
    return 0 if window is None else max(0, position - window + 1)


def paged_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, meta,
                    window: int | None = None, scores_scale: float | None = None,
                    softcap: float | None = None) -> np.ndarray:
    """Causal GQA attention of T query tokens (T, n_heads, D) over the paged pool.

    Token t attends to positions 0..positions[t] of sequence token_seq[t] (with a
    sliding window W: the last W of them), whose K/V are found through
    block_tables[token_seq[t]] (meta: AttentionMetadata). Serves decode (one token
    per sequence) and prefill over a cached prefix plus new tokens alike.
    """
    block_tables, positions, token_seq = meta.block_tables, meta.positions, meta.token_seq
    k_cache, v_cache = kv_values(k_cache), kv_values(v_cache)
    block_size, n_kv, head_dim = k_cache.shape[1:]
    # (causal_attention divides by sqrt(D): another scale is folded into q)
    if scores_scale is not None:
        q = q * np.asarray(scores_scale * head_dim ** 0.5, dtype=q.dtype)
    k_flat = k_cache.reshape(-1, n_kv, head_dim)  # (slots, n_kv, D)
    v_flat = v_cache.reshape(-1, n_kv, head_dim)
    out = np.empty_like(q)
    for t in range(len(q)):
        context = np.arange(first_key(positions[t], window), positions[t] + 1)
        table = block_tables[token_seq[t]]
        slots = table[context // block_size].astype(np.int64) * block_size + context % block_size
        out[t] = causal_attention(q[t:t + 1], k_flat[slots], v_flat[slots], np.array([len(slots) - 1]),
                                  softcap=softcap)[0]
    return out


def copy_blocks(k_cache: np.ndarray, v_cache: np.ndarray, pairs: list[tuple[int, int]]) -> None:
    """Copy-on-write: block dst gets block src's K/V, for each (src, dst)."""
    for src, dst in pairs:
        k_cache[..., dst, :, :, :] = k_cache[..., src, :, :, :]
        v_cache[..., dst, :, :, :] = v_cache[..., src, :, :, :]


# -- the rest of the backend interface (same names and signatures in every backend) --
# Arrays here are NumPy arrays; a GPU backend's are device arrays, and
# prepare_weights / allocate_kv / prepare_inputs / to_host move data across.

def use_in_this_thread() -> None:
    """Make this thread ready to run the backend's ops (a GPU backend selects its
    device: a new thread starts on device 0). The host needs nothing."""


def default_kv_memory(config) -> int:
    """Bytes the KV pool may take at most when the user names no size: a share of free RAM."""
    from ..config import DEFAULT_KV_MEMORY_FRACTION, available_memory_bytes
    return int(available_memory_bytes() * DEFAULT_KV_MEMORY_FRACTION)


def memory_available() -> int:
    """Bytes the backend can allocate now (here: free RAM); checked before the KV pool
    and the RoPE tables are allocated."""
    from ..config import available_memory_bytes
    return available_memory_bytes()


class WidenedPacked:
    """A packed (quantized) matrix widened to float32 (`dense`, (N, K)). What makes it
    more than its float values: its products round x first (round_activations)."""
    __slots__ = ("dense", "kind")

    def __init__(self, dense: np.ndarray, kind):
        self.dense, self.kind = dense, kind

    @property
    def shape(self) -> tuple[int, int]:
        return self.dense.shape

    @property
    def nbytes(self) -> int:
        return self.dense.nbytes

    def dequantize(self, rows=slice(None)) -> np.ndarray:
        return self.dense[rows]


def prepare_weights(weights: dict) -> dict:
    """The backend's own form of the weights: float32 arrays; packed matrices widened
    into WidenedPacked, float16 ones widened (the reference is the oracle, not the
    fast path)."""
    def widened(w):
        if isinstance(w, np.ndarray):
            return np.asarray(w, dtype=np.float32)
        return WidenedPacked(w.dequantize(), w.kind) if is_packed(w) else w.dequantize()
    return {name: widened(w) for name, w in weights.items()}


def load_prepared_weights(source) -> dict | None:
    """prepare_weights' result for the model file `source`, kept from an earlier load
    (the CPU backend keeps one: cpu/weight_cache.py); None: prepare them anew."""
    return None


def save_prepared_weights(source, weights: dict) -> None:
    """Keep prepare_weights' result for the next load of `source` (here: not kept)."""


def allocate_kv(shape: tuple[int, ...], dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """The KV pool, K and V of `shape` (n_layers, num_blocks, block_size, n_kv, D); int8:
    kv_q8.py's rows in place of the D values."""
    if np.dtype(dtype) == KV_INT8:
        shape = (*shape[:-1], row_width(shape[-1]))
    return np.zeros(shape, dtype=dtype), np.zeros(shape, dtype=dtype)


def prepare_inputs(token_ids: np.ndarray, meta):
    """One step's token ids and AttentionMetadata, where the kernels can read them."""
    return token_ids, meta


def step_workspace():
    """The scope of one step (a forward pass): the CPU backend hands out its large
    outputs from a per-step workspace within it (cpu/out_arrays.py); here nothing."""
    return nullcontext()


def to_host(x: np.ndarray) -> np.ndarray:
    return x


def logits_for_sampling(logits: np.ndarray, needs: list[int]):
    """A step's logits for the sampler (batch/step_logits.py): on the host already,
    so every row is there whole (needs changes nothing)."""
    return HostLogits(logits)


def embedding(token_ids: np.ndarray, table) -> np.ndarray:
    """Rows of table (V, H) for token_ids (T,) -> (T, H); a packed table (PackedWeight)
    widens only those rows."""
    if isinstance(table, np.ndarray):
        return table[token_ids]
    return table.dequantize(token_ids)


def gather_rows(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
    return x[indices]


def gate_up_gelu(x: np.ndarray, w_gate, w_up) -> np.ndarray:
    """gelu_tanh(x @ w_gate.T) * (x @ w_up.T)."""
    return gelu_tanh_mul(linear(x, w_gate), linear(x, w_up))


def scale(x: np.ndarray, factor: float) -> np.ndarray:
    """x times factor (a float32 factor: as the models' float32 multipliers)."""
    return x * np.float32(factor)


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap) (Gemma 2's logits)."""
    cap = np.asarray(cap, dtype=x.dtype)
    return cap * np.tanh(x / cap)


def add(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x + y, elementwise (a residual add that no norm follows directly)."""
    return x + y


def add_rms_norm(x: np.ndarray, residual: np.ndarray | None, weight: np.ndarray,
                 eps: float) -> tuple[np.ndarray, np.ndarray]:
    """The residual stream's add and the next norm: r = x + residual (x alone when
    residual is None), returns (rms_norm(r), r)."""
    residual = x if residual is None else x + residual
    return rms_norm(residual, weight, eps), residual


def norm_for_products(x: np.ndarray, residual: np.ndarray | None, weight: np.ndarray,
                      eps: float) -> tuple[np.ndarray, np.ndarray]:
    """add_rms_norm whose output goes to products only (linear, qkv_proj, gate_up*,
    add_lora): a backend may fold the norm into them (the CUDA one does at decode)."""
    return add_rms_norm(x, residual, weight, eps)


def qkv_proj(x: np.ndarray, wq, wk, wv, bq=None, bk=None, bv=None, ahead=None):
    """The attention's three projections of x (T, H): (q, k, v); ahead: as linear's."""
    return linear(x, wq, bq), linear(x, wk, bk), linear(x, wv, bv)


def gate_up_silu(x: np.ndarray, w_gate, w_up) -> np.ndarray:
    """The MLP's middle: silu(x @ w_gate.T) * (x @ w_up.T), (T, I)."""
    return silu_mul(linear(x, w_gate), linear(x, w_up))


def rope_write_kv(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray,
                  cos_table: np.ndarray, sin_table: np.ndarray, k_cache: np.ndarray,
                  v_cache: np.ndarray, slot_mapping: np.ndarray) -> np.ndarray:
    """Rotate q (T, n_heads, D) and k (T, n_kv, D), store k and v at their slots;
    returns the rotated q."""
    write_kv(k_cache, v_cache, rope(k, positions, cos_table, sin_table), v, slot_mapping)
    return rope(q, positions, cos_table, sin_table)


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (T, K) float32, K a multiple of 32 -> q (T, K) int8, d (T, K/32) float32: per
    block of 32, d = max|x| / 127 and q = round-half-even(x * (1 / d)) (0 where d = 0),
    all in float32 (llama.cpp's Q8 rounding of activations)."""
    blocks = np.asarray(x, dtype=np.float32).reshape(len(x), -1, QK)
    d = np.abs(blocks).max(axis=2) / np.float32(127)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    q = np.rint(blocks * inverse[:, :, None]).astype(np.int8)
    return q.reshape(x.shape), d


def round_activations(x: np.ndarray) -> np.ndarray:
    """x (T, K) as a packed weight takes it: each value as its block's d * q (float32).
    The error is at most half a step, d / 2, per value."""
    q, d = quantize_activations(x)
    rounded = q.reshape(len(x), -1, QK).astype(np.float32) * d[:, :, None]
    return rounded.reshape(x.shape)


def linear(x: np.ndarray, weight, bias: np.ndarray | None = None, ahead=None) -> np.ndarray:
    """x (T, K) @ weight (N, K).T (+ bias (N,)) -> (T, N); a WidenedPacked weight
    multiplies round_activations(x). ahead: None, or bytes (flat uint8, on the host) the
    caller reads right after; a backend may hint them into the caches while the product
    runs (no value changes; here: nothing)."""
    if isinstance(weight, WidenedPacked):
        x, weight = round_activations(x), weight.dense
    y = x @ weight.T
    return y if bias is None else y + bias


def rope_tables(max_positions: int, head_dim: int, rope: "Rope | float",
                dtype=np.float32, positions_at_once: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin (max_positions, D/2): angle of pair i at position p = p * inv_freq[i]
    (theta^(-2i/D) unscaled); rope_cos_sin's first halves, bit for bit, computed a few
    thousand positions at a time (whole, the float64 temporaries of Gemma 3's 32,768
    positions x 256 took 200 MB at load)."""
    rope = rope if isinstance(rope, Rope) else Rope(float(rope))
    inv_freq = rope.inv_freq(head_dim)  # (D/2,)
    cos = np.empty((max_positions, head_dim // 2), dtype=dtype)
    sin = np.empty_like(cos)
    for p0 in range(0, max_positions, positions_at_once):
        p1 = min(max_positions, p0 + positions_at_once)
        angles = np.arange(p0, p1, dtype=np.float64)[:, None] * inv_freq[None, :]  # (T, D/2)
        cos[p0:p1] = np.cos(angles) * rope.attention_factor
        sin[p0:p1] = np.sin(angles) * rope.attention_factor
    return cos, sin


def rope(x: np.ndarray, positions: np.ndarray, cos_table: np.ndarray,
         sin_table: np.ndarray) -> np.ndarray:
    """apply_rope with angles looked up in rope_tables; x (T, heads, D)."""
    cos = np.concatenate([cos_table[positions]] * 2, axis=-1)  # (T, D)
    sin = np.concatenate([sin_table[positions]] * 2, axis=-1)
    return apply_rope(x, cos, sin)


# -- sampling (on the host for every backend: logits come back to the host) ----------

SUM_LANES = 16  # a long row's total weight: 16 interleaved float64 sums (weight_total)
SEQUENTIAL_TERMS = 1024  # up to this many weights, one sequential sum


def weight_total(w: np.ndarray) -> float:
    """The float64 total of a row's weights w (float64, id order): one sum in id order
    for up to SEQUENTIAL_TERMS of them, else SUM_LANES sums in id order, weight i into
    lane i % SUM_LANES, then the lanes added lane 0 first. (A whole vocabulary's single
    chain of dependent adds took ~50 us a row; the lanes' adds are independent.)"""
    if len(w) <= SEQUENTIAL_TERMS:
        return float(np.cumsum(w)[-1])
    total = 0.0
    for lane in range(SUM_LANES):
        total += float(np.cumsum(w[lane::SUM_LANES])[-1])
    return total


def sample_filtered(weights: np.ndarray, top_k: int, top_p: float, min_p: float,
                    u: float) -> int:
    """The sampling spec, for one row. weights (V,) float32: exp(logits / T - max), so
    the most likely token weighs 1. Kept: the top_k heaviest (0: all; ties with the
    k-th are kept), of those the nucleus (the fewest heaviest, ties by lower id, whose
    weight before them is < top_p of the kept total), of those the tokens weighing
    >= min_p. The draw walks the kept tokens in id order and returns the first whose
    running weight exceeds u * their total (u uniform in [0, 1)). Sums are float64,
    in id order (the nucleus's total over a whole row: weight_total's lanes), so the
    numba kernel (kernels/cpu/sampling.py) matches bit for bit."""
    w = weights.astype(np.float64)
    keep = np.ones(len(w), dtype=bool)
    if 0 < top_k < len(w):
        keep &= weights >= np.sort(weights)[-top_k]
    if top_p < 1.0:  # (with top-k, the few kept in one sum; else weight_total)
        total = np.cumsum(np.where(keep, w, 0.0))[-1] if 0 < top_k < len(w) else weight_total(w)
        ids = np.flatnonzero(keep)
        order = ids[np.argsort(-weights[ids], kind="stable")]  # heaviest first, ties by id
        before = np.concatenate([[0.0], np.cumsum(w[order])[:-1]])
        nucleus = np.zeros_like(keep)
        nucleus[order[before < top_p * total]] = True
        keep &= nucleus
    if min_p > 0.0:
        keep &= weights >= np.float32(min_p)
    cdf = np.cumsum(np.where(keep, w, 0.0))
    return int(np.searchsorted(cdf, u * cdf[-1], side="right"))


def apply_token_mask(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """logits (V,) with every token not allowed by mask set to -inf. mask: int32 words,
    token t allowed when bit t % 32 of word t // 32 is set (llguidance's layout)."""
    allowed = np.unpackbits(mask.astype("<i4").view(np.uint8), bitorder="little")[:len(logits)]
    return np.where(allowed.astype(bool), logits, -np.inf).astype(logits.dtype)


def gate_up(x: np.ndarray, w_gate, w_up, ahead=None) -> tuple[np.ndarray, np.ndarray]:
    """(x @ w_gate.T, x @ w_up.T): the MLP's products before its activation; ahead:
    as linear's."""
    return linear(x, w_gate), linear(x, w_up)


def upload(x: np.ndarray) -> np.ndarray:
    """A host array where this backend's kernels read it (here: as it is)."""
    return x


def lora_groups(rows: np.ndarray, slots: np.ndarray):
    """A step's adapted rows (grouped by slot) and their slots, as add_lora takes them."""
    return rows, slots


def lora_stacks(stacks: list, region: np.ndarray | None = None) -> list:
    """The stacks of products that share an input, as add_lora takes them (here: the
    list of (a, bt, ranks, scales) as it is). Made once per layer's products, not per
    step. region: the host buffer (slots, bytes a slot) the stacks' a and bt are
    views of, slot by slot (model.lora_slots.slot_major), where there is one."""
    return stacks


def add_lora(x: np.ndarray, ys, stacks, rows: np.ndarray, slots: np.ndarray) -> None:
    """LoRA's low-rank terms of products that share their input x (T, in), each added
    in place to its product y (T, out): y[row] += scales[s] * (x[row] @ a[s, :r].T) @
    bt[s, :r], r = ranks[s], for each rows[k] with slot s = slots[k] (rows: the batch
    rows that run an adapter, grouped by slot; lora_groups' form). ys: the products;
    stacks: lora_stacks of their (a, bt, ranks, scales), in the same order; a (S, R,
    in), bt (S, R, out): each slot's A and B^T, zero past its rank; ranks[s] 0: slot s
    does not adapt this product."""
    for y, (a, bt, ranks, scales) in zip(ys, stacks):
        for row, s in zip(rows, slots):
            r = ranks[s]
            if r:
                t = (x[row] @ a[s, :r].T) * scales[s]  # (r,)
                y[row] += t @ bt[s, :r]

"""CPU paged attention (numba; one pass per query token over its context).

One kernel serves decode (one query per sequence) and prefill over a cached
prefix plus new tokens: each query token walks its own sequence's block table
up to its own position (causal). It reads each context row once, all KV heads
together (a row is n_kv x D contiguous floats in the pool, and the rows of a
block follow each other), so the pool streams through memory in order; every
query head of a GQA group uses the row while it is in L1. The softmax is online
(running max and sum, rescaled when the max grows), taken a KV block's positions
at a time: their scores, their weights in one vectorised pass (fast_exp.exp32, where
libm's expf was a call per score), then V; K and V are read in the same pass. Traffic per token: (position + 1) K and V
rows of n_kv x D floats (float32, or float16 bits widened as they are read).

At batch 64 and 125-token contexts this is 2x the previous two-pass kernel
(which walked the pool once per KV head, K and V separately): the pool is far
larger than the caches, and this step is bound by reading it.

Decode batches (up to linear.NUMBA_MAX_ROWS tokens, whose matrix products are
numba kernels too) run it on numba's threads, tokens dealt round-robin. Larger
batches run it on one thread: their products run in BLAS's threads, and numba's
OpenMP workers would fight those for the two cores (measured: 1.5 ms serial vs
8.5 ms with prange right after a BLAS call).
"""
import numpy as np
from numba import float32, njit, prange

from .common import N_CHUNKS, kv_widen
from .fast_exp import exp32
from .linear import NUMBA_MAX_ROWS

NO_SCORE = float32(-3.0e38)  # below any score; finite, as fastmath assumes no infinities


@njit(fastmath=True, inline="always")
def _attend_one_token(q, k_cache, v_cache, table, position, t, scale, window, softcap, acc, top,
                      total, scores, out):
    """out[t] = softmax(q[t] . K) V over positions 0 .. position of one sequence's
    blocks (the last `window` of them when window > 0; scores soft-capped when
    softcap > 0); acc (n_heads, D), top and total (n_heads,), scores (block_size,)
    are the caller's scratch. A KV block's positions at a time: their scores, then
    their weights e^(score - max) in one vectorised pass (fast_exp), then V."""
    n_heads, head_dim = q.shape[1], q.shape[2]
    block_size, n_kv = k_cache.shape[1], k_cache.shape[2]
    group = n_heads // n_kv
    acc[:] = 0.0
    top[:] = NO_SCORE
    total[:] = 0.0
    j = max(0, position - window + 1) if window > 0 else 0
    while j <= position:
        block, offset = table[j // block_size], j % block_size
        n = min(position + 1 - j, block_size - offset)  # positions of this block in the span
        for kvh in range(n_kv):
            for h in range(kvh * group, (kvh + 1) * group):
                best = top[h]
                for i in range(n):
                    k_row = k_cache[block, offset + i, kvh]  # (D,)
                    dot = float32(0.0)
                    for d in range(head_dim):
                        dot += q[t, h, d] * kv_widen(k_row[d])
                    score = dot * scale
                    if softcap > 0:  # Gemma 2
                        score = softcap * np.tanh(score / softcap)
                    scores[i] = score
                    best = max(best, score)
                if best > top[h]:  # a new max: rescale what was summed so far
                    shrink = exp32(top[h] - best)
                    total[h] *= shrink
                    for d in range(head_dim):
                        acc[h, d] *= shrink
                    top[h] = best
                weight = float32(0.0)
                for i in range(n):
                    scores[i] = exp32(scores[i] - best)
                    weight += scores[i]
                total[h] += weight
                for i in range(n):
                    v_row, p = v_cache[block, offset + i, kvh], scores[i]
                    for d in range(head_dim):
                        acc[h, d] += p * kv_widen(v_row[d])
        j += n
    for h in range(n_heads):
        inv = float32(1.0) / total[h]
        for d in range(head_dim):
            out[t, h, d] = acc[h, d] * inv


@njit(fastmath=True, cache=True, error_model="numpy")
def _paged_attention(q, k_cache, v_cache, block_tables, positions, token_seq, scale, window,
                     softcap, out):
    n_heads, head_dim = q.shape[1], q.shape[2]
    acc = np.empty((n_heads, head_dim), dtype=np.float32)  # sum of p * V, per query head
    top = np.empty(n_heads, dtype=np.float32)  # running max score
    total = np.empty(n_heads, dtype=np.float32)  # running sum of exp(score - top)
    scores = np.empty(k_cache.shape[1], dtype=np.float32)  # a block's scores, then weights
    for t in range(q.shape[0]):
        _attend_one_token(q, k_cache, v_cache, block_tables[token_seq[t]], positions[t], t,
                          scale, window, softcap, acc, top, total, scores, out)


@njit(fastmath=True, parallel=True, cache=True, error_model="numpy")
def _paged_attention_parallel(q, k_cache, v_cache, block_tables, positions, token_seq, scale,
                              window, softcap, out):
    """_paged_attention with the tokens dealt round-robin to N_CHUNKS work items (so
    a causal prefill's long and short rows mix in every item)."""
    n_tokens, n_heads, head_dim = q.shape
    for c in prange(N_CHUNKS):
        acc = np.empty((n_heads, head_dim), dtype=np.float32)
        top = np.empty(n_heads, dtype=np.float32)
        total = np.empty(n_heads, dtype=np.float32)
        scores = np.empty(k_cache.shape[1], dtype=np.float32)
        for t in range(c, n_tokens, N_CHUNKS):
            _attend_one_token(q, k_cache, v_cache, block_tables[token_seq[t]], positions[t], t,
                              scale, window, softcap, acc, top, total, scores, out)


def paged_attention(q, k_cache, v_cache, meta, window=None, scores_scale=None, softcap=None):
    """q (T, n_heads, D) -> (T, n_heads, D); see kernels/reference.paged_attention.
    Batches small enough for linear.py's numba kernels run on numba's threads too;
    larger ones (whose products run in BLAS's threads) on this one."""
    parallel = len(q) <= NUMBA_MAX_ROWS
    out = np.empty_like(q)
    scale = np.float32(1.0 / np.sqrt(q.shape[-1]) if scores_scale is None else scores_scale)
    kernel = _paged_attention_parallel if parallel else _paged_attention
    kernel(q, k_cache, v_cache, meta.block_tables, meta.positions, meta.token_seq, scale,
           window or 0, np.float32(softcap or 0.0), out)
    return out

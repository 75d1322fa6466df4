"""CPU paged attention (numba; a loop over query tokens x KV heads).

One kernel serves decode (one query per sequence) and prefill over a cached
prefix plus new tokens: each query token walks its own sequence's block table
up to its own position (causal). The query heads that share a KV head (GQA) are
handled together, so each K/V row is read from the pool once per group.
Traffic per (token, KV head): (position + 1) K rows and V rows of D floats.
It runs on one thread: the steps that have much attention work are the ones
whose matrix products run in BLAS's threads, and numba's OpenMP workers would
fight those for the two cores (see linear.py).
"""
import numpy as np
from numba import float32, njit


@njit(fastmath=True, cache=True)
def _paged_attention(q, k_cache, v_cache, block_tables, positions, token_seq, scale, out):
    n_tokens, n_heads, head_dim = q.shape
    block_size, n_kv = k_cache.shape[1], k_cache.shape[2]
    group = n_heads // n_kv
    for item in range(n_tokens * n_kv):
        t, kvh = item // n_kv, item % n_kv
        n_ctx = positions[t] + 1
        table = block_tables[token_seq[t]]
        scores = np.empty((group, n_ctx), dtype=np.float32)
        for j in range(n_ctx):  # pass 1: scaled scores q . k
            block, offset = table[j // block_size], j % block_size
            for g in range(group):
                acc = float32(0.0)
                for d in range(head_dim):
                    acc += q[t, kvh * group + g, d] * k_cache[block, offset, kvh, d]
                scores[g, j] = acc * scale
        for g in range(group):  # pass 2: softmax over the context
            m = scores[g, 0]
            for j in range(1, n_ctx):
                m = max(m, scores[g, j])
            total = float32(0.0)
            for j in range(n_ctx):
                scores[g, j] = np.exp(scores[g, j] - m)
                total += scores[g, j]
            inv = float32(1.0) / total
            for j in range(n_ctx):
                scores[g, j] *= inv
            for d in range(head_dim):
                out[t, kvh * group + g, d] = 0.0
        for j in range(n_ctx):  # pass 3: probability-weighted sum of V rows
            block, offset = table[j // block_size], j % block_size
            for g in range(group):
                p = scores[g, j]
                for d in range(head_dim):
                    out[t, kvh * group + g, d] += p * v_cache[block, offset, kvh, d]


def paged_attention(q, k_cache, v_cache, meta):
    """q (T, n_heads, D) -> (T, n_heads, D); see kernels/reference.paged_attention."""
    out = np.empty_like(q)
    scale = np.float32(1.0 / np.sqrt(q.shape[-1]))
    _paged_attention(q, k_cache, v_cache, meta.block_tables, meta.positions, meta.token_seq,
                     scale, out)
    return out

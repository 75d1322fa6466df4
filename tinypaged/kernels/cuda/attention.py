"""CUDA paged attention: decode (one query per sequence) and tiled prefill.

Both read K/V through the block table: position j of sequence s lives in block
block_tables[s, j // block_size] at offset j % block_size. GQA: query head h uses
KV head h // (n_heads // n_kv). Scores are scaled by `scale` = 1/sqrt(D).
"""
import math

from numba import cuda, float32

MAX_HEAD_DIM = 128  # bound for local and shared per-head arrays
DECODE_THREADS = 32  # decode: threads per (token, head), each over its own keys
Q_TILE = 16  # prefill: queries per block
KV_TILE = 16  # prefill: keys staged in shared memory per step
PREFILL_THREADS = 64
NEG_INF = float32(-math.inf)


@cuda.jit
def paged_attention_decode(q, k_cache, v_cache, block_tables, positions, token_seq,
                           decode_rows, scale, out):
    """Grid (len(decode_rows), n_heads), block DECODE_THREADS.

    Block (i, h) answers query token r = decode_rows[i], head h, over positions
    0..positions[r]. Thread t takes keys t, t + DECODE_THREADS, ... and keeps its own
    online softmax (max m, sum l, weighted V sum acc[D]): one pass over K and V.
    The block then merges the threads' states in shared memory. Traffic: each K and
    V row of the context read once per head.
    """
    m_all = cuda.shared.array(DECODE_THREADS, dtype=float32)
    l_all = cuda.shared.array(DECODE_THREADS, dtype=float32)
    acc_all = cuda.shared.array(MAX_HEAD_DIM, dtype=float32)
    acc = cuda.local.array(MAX_HEAD_DIM, dtype=float32)
    t, h = cuda.threadIdx.x, cuda.blockIdx.y
    r = decode_rows[cuda.blockIdx.x]
    head_dim = q.shape[2]
    if positions[r] < 0:  # a padding row of a static decode step: zeros, no reads
        if t < head_dim:
            out[r, h, t] = float32(0.0)
        return
    block_size = k_cache.shape[1]
    kvh = h // (q.shape[1] // k_cache.shape[2])
    s = token_seq[r]
    m, l = NEG_INF, float32(0.0)
    for d in range(head_dim):
        acc[d] = float32(0.0)
    for j in range(t, positions[r] + 1, DECODE_THREADS):
        block, offset = block_tables[s, j // block_size], j % block_size
        score = float32(0.0)
        for d in range(head_dim):
            score += q[r, h, d] * k_cache[block, offset, kvh, d]
        score *= scale
        m_new = max(m, score)
        correction = math.exp(m - m_new)  # 0 on the first key (m = -inf)
        p = math.exp(score - m_new)
        l = l * correction + p
        for d in range(head_dim):
            acc[d] = acc[d] * correction + p * v_cache[block, offset, kvh, d]
        m = m_new
    m_all[t] = m
    if t < head_dim:
        acc_all[t] = float32(0.0)
    cuda.syncthreads()  # every thread's max is visible
    m_max = NEG_INF
    for i in range(DECODE_THREADS):
        m_max = max(m_max, m_all[i])
    weight = math.exp(m - m_max) if l > 0 else float32(0.0)  # threads without keys add nothing
    l_all[t] = l * weight
    for d in range(head_dim):
        cuda.atomic.add(acc_all, d, acc[d] * weight)
    cuda.syncthreads()  # all partial sums are accumulated
    if t < head_dim:
        total = float32(0.0)
        for i in range(DECODE_THREADS):
            total += l_all[i]
        out[r, h, t] = acc_all[t] / total


@cuda.jit
def paged_attention_prefill(q, k_cache, v_cache, block_tables, positions, token_seq,
                            prefill_tiles, scale, out):
    """Grid (len(prefill_tiles), n_heads), block PREFILL_THREADS; flash-style.

    Tile i holds query rows r0 .. r0 + nq - 1 (prefill_tiles[i] = (r0, nq), nq <=
    Q_TILE) of one sequence at consecutive positions p0 .. p0 + nq - 1. The block
    walks the keys 0 .. p0 + nq - 1 KV_TILE at a time: stages K/V in shared memory
    (through the block table, so a cached prefix is read like new tokens), scores
    the tile, and updates each query's online softmax. Traffic: each K/V row read
    once per (tile, head) instead of once per query.
    """
    q_s = cuda.shared.array((Q_TILE, MAX_HEAD_DIM), dtype=float32)
    k_s = cuda.shared.array((KV_TILE, MAX_HEAD_DIM), dtype=float32)
    v_s = cuda.shared.array((KV_TILE, MAX_HEAD_DIM), dtype=float32)
    acc = cuda.shared.array((Q_TILE, MAX_HEAD_DIM), dtype=float32)
    p_s = cuda.shared.array((Q_TILE, KV_TILE), dtype=float32)  # scores, then probabilities
    m_s = cuda.shared.array(Q_TILE, dtype=float32)
    l_s = cuda.shared.array(Q_TILE, dtype=float32)
    corr_s = cuda.shared.array(Q_TILE, dtype=float32)
    t, h = cuda.threadIdx.x, cuda.blockIdx.y
    r0, nq = prefill_tiles[cuda.blockIdx.x, 0], prefill_tiles[cuda.blockIdx.x, 1]
    head_dim = q.shape[2]
    block_size = k_cache.shape[1]
    kvh = h // (q.shape[1] // k_cache.shape[2])
    s, p0 = token_seq[r0], positions[r0]
    for e in range(t, Q_TILE * head_dim, PREFILL_THREADS):
        qi, d = e // head_dim, e % head_dim
        q_s[qi, d] = q[r0 + qi, h, d] if qi < nq else float32(0.0)
        acc[qi, d] = float32(0.0)
    if t < Q_TILE:
        m_s[t], l_s[t] = NEG_INF, float32(0.0)
    cuda.syncthreads()  # queries staged, state initialised

    for k0 in range(0, p0 + nq, KV_TILE):
        for e in range(t, KV_TILE * head_dim, PREFILL_THREADS):
            j, d = e // head_dim, e % head_dim
            pos = k0 + j
            if pos < p0 + nq:
                block, offset = block_tables[s, pos // block_size], pos % block_size
                k_s[j, d] = k_cache[block, offset, kvh, d]
                v_s[j, d] = v_cache[block, offset, kvh, d]
        cuda.syncthreads()  # K/V tile staged
        for e in range(t, Q_TILE * KV_TILE, PREFILL_THREADS):
            qi, j = e // KV_TILE, e % KV_TILE
            score = NEG_INF
            if qi < nq and k0 + j <= p0 + qi:  # causal: key position <= query position
                score = float32(0.0)
                for d in range(head_dim):
                    score += q_s[qi, d] * k_s[j, d]
                score *= scale
            p_s[qi, j] = score
        cuda.syncthreads()  # scores of the tile complete
        if t < Q_TILE:
            m_new = m_s[t]
            for j in range(KV_TILE):
                m_new = max(m_new, p_s[t, j])
            corr = math.exp(m_s[t] - m_new) if m_new > NEG_INF else float32(0.0)
            total = float32(0.0)
            for j in range(KV_TILE):
                p = math.exp(p_s[t, j] - m_new) if m_new > NEG_INF else float32(0.0)
                p_s[t, j] = p
                total += p
            l_s[t] = l_s[t] * corr + total
            m_s[t], corr_s[t] = m_new, corr
        cuda.syncthreads()  # probabilities and corrections ready
        for e in range(t, Q_TILE * head_dim, PREFILL_THREADS):
            qi, d = e // head_dim, e % head_dim
            a = acc[qi, d] * corr_s[qi]
            for j in range(KV_TILE):
                if k0 + j < p0 + nq:
                    a += p_s[qi, j] * v_s[j, d]
            acc[qi, d] = a
        cuda.syncthreads()  # done with this tile's shared arrays

    for e in range(t, nq * head_dim, PREFILL_THREADS):
        qi, d = e // head_dim, e % head_dim
        out[r0 + qi, h, d] = acc[qi, d] / l_s[qi]

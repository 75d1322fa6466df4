"""CUDA paged attention: decode (one query per sequence) and tiled prefill.

Both read K/V through the block table: position j of sequence s lives in block
block_tables[s, j // block_size] at offset j % block_size. GQA: query head h uses
KV head h // (n_heads // n_kv). Scores are scaled by `scale` = 1/sqrt(D). With a
sliding window (window > 0), a query at position p sees keys p - window + 1 .. p
only; window 0 means every key up to p. softcap > 0 (Gemma 2) turns each scaled
score s into softcap * tanh(s / softcap).
"""
import math

from numba import cuda, float32

from .bounded_jit import jit_bounded
from .disk_cache import cached_kernel
from .warp import warp_sum

MAX_HEAD_DIM = 128  # bound for shared per-head arrays; decode lanes hold 4 dimensions each
PARTITION = 128  # decode: keys per split-K partition (one block per KV head and partition)
KEYS_PER_STEP = 2  # decode: keys each iteration scores together (unrolled by hand; four
#   spill under the 64-register bound that 32-warp blocks impose)
MERGE_THREADS = MAX_HEAD_DIM  # merge_partitions: one thread per dimension
MAX_DECODE_THREADS = 1024  # decode: 32 warps, a GQA group of up to 32 query heads; as a
#   launch bound it also holds the kernel to 64 registers (65,536 / 1,024)
Q_TILE = 16  # prefill: queries per block
KV_TILE = 16  # prefill: keys staged in shared memory per step
PREFILL_THREADS = 128
PREFILL_BLOCKS_PER_SM = 6  # what its ~34 KB of shared memory allows; as a launch bound it
#   keeps registers at or under 85 a thread so that registers do not lower it further
NEG_INF = float32(-math.inf)


@cuda.jit(device=True, inline="always")
def _lane_value(a, i, j, k, d, head_dim):
    """a[i, j, k, d] as float32 (the pool may be float16), or 0 past the head."""
    return float32(a[i, j, k, d]) if d < head_dim else float32(0.0)


@jit_bounded(MAX_DECODE_THREADS)
def paged_attention_decode(q, k_cache, v_cache, block_tables, positions, token_seq,
                           decode_rows, scale, window, softcap, part_acc, part_ml, out):
    """Split-K, GQA-grouped decode attention, FlashDecoding style.

    Grid (len(decode_rows), n_kv, n_partitions), block (32 * group,): block (i, kvh, p)
    takes query row r = decode_rows[i], the `group` query heads that share KV head
    kvh (one warp each), and the keys p * PARTITION ... of that row's context (blocks
    past the context exit). Lane l holds dimensions l, l + 32, l + 64, l + 96 of q,
    and of its online-softmax sum, in registers (no local arrays): per key the
    warp's loads are 128 consecutive bytes per dimension slot, the dot product is a
    shfl_xor butterfly, and the group's warps read the same K/V row (one fetch from
    memory, L1 for the rest). Keys go KEYS_PER_STEP at a time: two loads and two
    butterflies in flight, one rescale of the running sum for the two. One
    partition: out = acc / l directly; several: each
    leaves its unnormalised acc (part_acc[i, h, p]) and (max, sum) (part_ml[i, h, p])
    for merge_partitions. Traffic: each K/V row of the context once per KV head.
    A padding row of a static step (position -1) has no keys: zeros. With a window,
    partitions wholly before it exit, and merge_partitions skips them alike.
    """
    lane, g = cuda.threadIdx.x % 32, cuda.threadIdx.x // 32
    i, kvh, part = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
    r = decode_rows[i]
    head_dim, block_size = q.shape[2], k_cache.shape[1]
    h = kvh * (q.shape[1] // k_cache.shape[2]) + g
    n_keys = positions[r] + 1
    first = max(0, n_keys - window) if window > 0 else 0  # the window's first key
    start = part * PARTITION
    single = cuda.gridDim.z == 1
    if start >= n_keys:
        if single:  # a padding row
            for d in range(lane, head_dim, 32):
                out[r, h, d] = float32(0.0)
        return
    if start + PARTITION <= first:  # wholly before the window (merge skips it)
        return
    end = min(start + PARTITION, n_keys)
    start = max(start, first)
    d0, d1, d2, d3 = lane, lane + 32, lane + 64, lane + 96
    q0 = q[r, h, d0] if d0 < head_dim else float32(0.0)
    q1 = q[r, h, d1] if d1 < head_dim else float32(0.0)
    q2 = q[r, h, d2] if d2 < head_dim else float32(0.0)
    q3 = q[r, h, d3] if d3 < head_dim else float32(0.0)
    a0 = a1 = a2 = a3 = float32(0.0)
    m, l = NEG_INF, float32(0.0)
    s = token_seq[r]
    # KEYS_PER_STEP keys an iteration: their loads and butterflies are independent, so
    # they overlap, and the running max and its rescale are paid once for both
    # (one key at a time, batch 1 with a short context waits on each key's latency)
    for j in range(start, end, KEYS_PER_STEP):
        b0, o0 = _slot(block_tables, s, j, block_size)
        b1, o1 = _slot(block_tables, s, j + 1, block_size)
        # (a key past the end scores -inf: weight 0; the warp takes every shuffle)
        s0 = _score(q0, q1, q2, q3, k_cache, b0, o0, kvh, lane, head_dim, scale, softcap, True)
        s1 = _score(q0, q1, q2, q3, k_cache, b1, o1, kvh, lane, head_dim, scale, softcap,
                    j + 1 < end)
        m_new = max(m, max(s0, s1))
        correction = math.exp(m - m_new)  # 0 on the first keys (m = -inf)
        p0, p1 = math.exp(s0 - m_new), math.exp(s1 - m_new)
        l = l * correction + (p0 + p1)
        a0 = a0 * correction + _weighted(v_cache, kvh, d0, head_dim, b0, o0, p0, b1, o1, p1)
        a1 = a1 * correction + _weighted(v_cache, kvh, d1, head_dim, b0, o0, p0, b1, o1, p1)
        a2 = a2 * correction + _weighted(v_cache, kvh, d2, head_dim, b0, o0, p0, b1, o1, p1)
        a3 = a3 * correction + _weighted(v_cache, kvh, d3, head_dim, b0, o0, p0, b1, o1, p1)
        m = m_new
    if single:
        inv = float32(1.0) / l
        _store_lanes(out, r, h, lane, head_dim, a0 * inv, a1 * inv, a2 * inv, a3 * inv)
    else:
        _store_part(part_acc, i, h, part, lane, head_dim, a0, a1, a2, a3)
        if lane == 0:
            part_ml[i, h, part, 0] = m
            part_ml[i, h, part, 1] = l


@cuda.jit(device=True, inline="always")
def _slot(block_tables, s, j, block_size):
    """(block, offset) of key j of sequence s; (-1, 0) past the table's end."""
    col = j // block_size
    if col >= block_tables.shape[1]:
        return -1, 0
    return block_tables[s, col], j % block_size


@cuda.jit(device=True, inline="always")
def _score(q0, q1, q2, q3, k_cache, block, offset, kvh, lane, head_dim, scale, softcap, live):
    """q . k of one key, scaled and soft-capped (every lane gets it), or -inf for a key
    not live. The warp always runs the butterfly: live is the same for all its lanes."""
    partial = float32(0.0)
    if live:
        partial = (q0 * _lane_value(k_cache, block, offset, kvh, lane, head_dim)
                   + q1 * _lane_value(k_cache, block, offset, kvh, lane + 32, head_dim)
                   + q2 * _lane_value(k_cache, block, offset, kvh, lane + 64, head_dim)
                   + q3 * _lane_value(k_cache, block, offset, kvh, lane + 96, head_dim))
    total = warp_sum(partial) * scale
    if softcap > float32(0.0):
        total = softcap * math.tanh(total / softcap)
    return total if live else NEG_INF


@cuda.jit(device=True, inline="always")
def _weighted(v_cache, kvh, d, head_dim, b0, o0, p0, b1, o1, p1):
    """p0 * v0[d] + p1 * v1[d] (a key of weight 0 is not read)."""
    acc = p0 * _lane_value(v_cache, b0, o0, kvh, d, head_dim)
    if p1 > float32(0.0):
        acc += p1 * _lane_value(v_cache, b1, o1, kvh, d, head_dim)
    return acc


@cuda.jit(device=True, inline="always")
def _store_lanes(out, r, h, lane, head_dim, a0, a1, a2, a3):
    if lane < head_dim:
        out[r, h, lane] = a0
    if lane + 32 < head_dim:
        out[r, h, lane + 32] = a1
    if lane + 64 < head_dim:
        out[r, h, lane + 64] = a2
    if lane + 96 < head_dim:
        out[r, h, lane + 96] = a3


@cuda.jit(device=True, inline="always")
def _store_part(part_acc, i, h, part, lane, head_dim, a0, a1, a2, a3):
    if lane < head_dim:
        part_acc[i, h, part, lane] = a0
    if lane + 32 < head_dim:
        part_acc[i, h, part, lane + 32] = a1
    if lane + 64 < head_dim:
        part_acc[i, h, part, lane + 64] = a2
    if lane + 96 < head_dim:
        part_acc[i, h, part, lane + 96] = a3


@cached_kernel()
def merge_partitions(positions, decode_rows, window, part_acc, part_ml, out):
    """Grid (len(decode_rows), n_heads), block (MERGE_THREADS,): thread d combines
    dimension d of the partitions of row decode_rows[i], head h, by log-sum-exp:
    out = sum_p acc_p e^(m_p - M) / sum_p l_p e^(m_p - M), M = max_p m_p. Reads only
    the partitions the row's context (or window) reaches (none for a padding row:
    zeros).
    Traffic: n_parts x (D + 2) floats a (row, head), against the 2 x context x D of
    K/V that the split kernel read."""
    i, h, d = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    if d >= out.shape[2]:
        return
    r = decode_rows[i]
    n_parts = (positions[r] + PARTITION) // PARTITION  # ceil((position + 1) / PARTITION)
    if n_parts <= 0:
        out[r, h, d] = float32(0.0)
        return
    first = max(0, positions[r] + 1 - window) // PARTITION if window > 0 else 0
    m_max = NEG_INF
    for p in range(first, n_parts):
        m_max = max(m_max, part_ml[i, h, p, 0])
    total, acc = float32(0.0), float32(0.0)
    for p in range(first, n_parts):
        weight = math.exp(part_ml[i, h, p, 0] - m_max)
        total += part_ml[i, h, p, 1] * weight
        acc += part_acc[i, h, p, d] * weight
    out[r, h, d] = acc / total


@jit_bounded((PREFILL_THREADS, PREFILL_BLOCKS_PER_SM))
def paged_attention_prefill(q, k_cache, v_cache, block_tables, positions, token_seq,
                            prefill_tiles, scale, window, softcap, out):
    """Grid (len(prefill_tiles), n_heads), block PREFILL_THREADS; flash-style.

    Tile i holds query rows r0 .. r0 + nq - 1 (prefill_tiles[i] = (r0, nq), nq <=
    Q_TILE) of one sequence at consecutive positions p0 .. p0 + nq - 1. The block
    walks the keys 0 .. p0 + nq - 1 KV_TILE at a time: stages K/V in shared memory
    (through the block table, so a cached prefix is read like new tokens), scores
    the tile, and updates each query's online softmax. Traffic: each K/V row read
    once per (tile, head) instead of once per query. With a window, the walk starts
    at the tile containing the first query's first key, and scores outside a
    query's window are -inf.
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

    lowest = max(0, p0 - window + 1) if window > 0 else 0  # the first query's first key
    for k0 in range(lowest - lowest % KV_TILE, p0 + nq, KV_TILE):
        for e in range(t, KV_TILE * head_dim, PREFILL_THREADS):
            j, d = e // head_dim, e % head_dim
            pos = k0 + j
            if lowest <= pos < p0 + nq:  # (before lowest: masked, its block maybe released)
                block, offset = block_tables[s, pos // block_size], pos % block_size
                k_s[j, d] = float32(k_cache[block, offset, kvh, d])  # (the pool may be float16)
                v_s[j, d] = float32(v_cache[block, offset, kvh, d])
        cuda.syncthreads()  # K/V tile staged
        for e in range(t, Q_TILE * KV_TILE, PREFILL_THREADS):
            qi, j = e // KV_TILE, e % KV_TILE
            score = NEG_INF
            if qi < nq and k0 + j <= p0 + qi and (window <= 0 or k0 + j > p0 + qi - window):
                # causal (key position <= query position), and inside the window
                score = float32(0.0)
                for d in range(head_dim):
                    score += q_s[qi, d] * k_s[j, d]
                score *= scale
                if softcap > float32(0.0):
                    score = softcap * math.tanh(score / softcap)
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
                if lowest <= k0 + j < p0 + nq:  # (only staged rows: p is 0 elsewhere)
                    a += p_s[qi, j] * v_s[j, d]
            acc[qi, d] = a
        cuda.syncthreads()  # done with this tile's shared arrays

    for e in range(t, nq * head_dim, PREFILL_THREADS):
        qi, d = e // head_dim, e % head_dim
        out[r0 + qi, h, d] = acc[qi, d] / l_s[qi]

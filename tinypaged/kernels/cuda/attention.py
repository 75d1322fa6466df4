"""CUDA paged attention: decode (one query per sequence) and tiled prefill.

Both read K/V through the block table: position j of sequence s lives in block
block_tables[s, j // block_size] at offset j % block_size. GQA: query head h uses
KV head h // (n_heads // n_kv). Scores are scaled by `scale` = 1/sqrt(D). With a
sliding window (window > 0), a query at position p sees keys p - window + 1 .. p
only; window 0 means every key up to p. softcap > 0 (Gemma 2) turns each scaled
score s into softcap * tanh(s / softcap). Each kernel is built once per form of the
pool (DECODE, PREFILL: kv_rows.POOL_READS): a float32 or float16 pool widened on
read, an int8 pool's values times their scales.
"""
import math

from numba import config, cuda, float32

from .bounded_jit import jit_bounded
from .disk_cache import cached_kernel
from .exact import NEG_INF
from .kv_rows import MAX_HEAD_DIM, POOL_READS, layer_rows, pool_form
from .warp import FULL_MASK, WARP, warp_max, warp_sum

PARTITION = 128  # decode: keys of one block (one block per row, KV head and partition)
# decode: keys a block loads and scores at once, four to a partition (the simulator,
# a Python thread per CUDA thread, takes 8: sixteen chunks, the same code paths)
GPU_CHUNK = 32
CHUNK = 8 if config.ENABLE_CUDASIM else GPU_CHUNK
LANES_PER_KEY = 8  # decode: threads that share one key's dimensions
DECODE_THREADS = CHUNK * LANES_PER_KEY  # 256: a chunk's keys all loaded at once
DECODE_WARPS = DECODE_THREADS // WARP
DIMS_PER_LANE = MAX_HEAD_DIM // LANES_PER_KEY  # a thread's dimensions of its key: d = lane + 8n
MAX_GROUP = 32  # decode: query heads a KV head serves (GQA)
GROUP_DIMS = MAX_GROUP * MAX_HEAD_DIM  # decode: a group's accumulators, in shared memory
MERGE_THREADS = 256  # merge_partitions: (dimension, partition group) pairs
MERGE_WARPS = MERGE_THREADS // WARP
Q_TILE = 16  # prefill: queries per block
KV_TILE = 16  # prefill: keys staged in shared memory per step
PREFILL_THREADS = 128
PREFILL_BLOCKS_PER_SM = 6  # what its ~34 KB of shared memory allows; as a launch bound it
#   keeps registers at or under 85 a thread so that registers do not lower it further


def _decode_kernel(kv_value, kv_rows):
    """paged_attention_decode over a pool read by kv_value and kv_rows (kv_rows.py)."""
    @jit_bounded((DECODE_THREADS, 1))
    def paged_attention_decode(q, k_cache, v_cache, block_tables, positions, token_seq,
                               decode_rows, scale, window, softcap, part_acc, part_ml, out):
        """Split-K, GQA-grouped decode attention, CHUNK keys at once.

        Grid (len(decode_rows), n_kv, n_partitions), block DECODE_THREADS: block (i, kvh,
        p) takes query row r = decode_rows[i], the `group` query heads that share KV head
        kvh, and keys p * PARTITION ... of r's context (blocks past it exit), a chunk of
        CHUNK keys at a time. In a chunk, thread t serves key c = t // 8 with dimensions
        e, e + 8, ... (e = t % 8): it loads its V dimensions into shared memory and its K
        dimensions for the group's dot products (no load waits on another: one memory
        latency for the chunk, where a warp walking the keys pays one per key); the 8
        threads of a key reduce by three shuffles; a warp per head updates the head's
        online softmax (lane = key); the block rescales its accumulators and adds the
        chunk's weighted V from shared memory. One partition: out = acc / l; several:
        the unnormalised acc (part_acc[i, h, p]) and (max, sum) (part_ml[i, h, p]) for
        merge_partitions. A padding row (position -1) has no keys: zeros. With a window,
        partitions wholly before it exit (merge skips them alike), and keys before it
        weigh 0.
        """
        v_s = cuda.shared.array((CHUNK, MAX_HEAD_DIM), dtype=float32)
        p_s = cuda.shared.array((MAX_GROUP, CHUNK), dtype=float32)  # scores, then weights
        ml_s = cuda.shared.array((MAX_GROUP, 3), dtype=float32)  # a head's (max, sum, rescale)
        acc_s = cuda.shared.array(GROUP_DIMS, dtype=float32)  # [g * head_dim + d]
        t = cuda.threadIdx.x
        i, kvh, part = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
        r = decode_rows[i]
        head_dim, block_size = q.shape[2], kv_rows(k_cache).shape[1]
        group = q.shape[1] // kv_rows(k_cache).shape[2]
        h0 = kvh * group  # the group's first query head
        n_keys = positions[r] + 1
        first = max(0, n_keys - window) if window > 0 else 0  # the window's first key
        start = part * PARTITION
        single = cuda.gridDim.z == 1
        if start >= n_keys:  # (the whole block returns: no barrier is left waiting)
            if single:  # a padding row
                for e in range(t, group * head_dim, DECODE_THREADS):
                    out[r, h0 + e // head_dim, e % head_dim] = float32(0.0)
            return
        if start + PARTITION <= first:  # wholly before the window (merge skips it)
            return
        for e in range(t, group * head_dim, DECODE_THREADS):
            acc_s[e] = float32(0.0)
        if t < group:
            ml_s[t, 0], ml_s[t, 1] = NEG_INF, float32(0.0)
        c, lane = t // LANES_PER_KEY, t % LANES_PER_KEY
        warp, key = t // WARP, t % WARP
        s = token_seq[r]
        end = min(start + PARTITION, n_keys)
        for c0 in range(max(start, first - first % CHUNK), end, CHUNK):  # chunks with live keys
            j = c0 + c
            live = first <= j < end
            block, offset = 0, 0
            cuda.syncthreads()  # the last chunk's weights and V rows are read
            if live:
                block, offset = block_tables[s, j // block_size], j % block_size
                for n in range(DIMS_PER_LANE):  # (a constant count: unrolled, loads in flight)
                    d = lane + LANES_PER_KEY * n
                    if d < head_dim:
                        v_s[c, d] = kv_value(v_cache, block, offset, kvh, d)
            for g in range(group):
                partial = float32(0.0)
                if live:
                    for n in range(DIMS_PER_LANE):
                        d = lane + LANES_PER_KEY * n
                        if d < head_dim:
                            partial += q[r, h0 + g, d] * kv_value(k_cache, block, offset, kvh, d)
                # key c's 8 threads are lanes 8k .. 8k + 7 of one warp: xor 4, 2, 1 stays inside
                partial += cuda.shfl_xor_sync(FULL_MASK, partial, 4)
                partial += cuda.shfl_xor_sync(FULL_MASK, partial, 2)
                partial += cuda.shfl_xor_sync(FULL_MASK, partial, 1)
                if lane == 0:
                    score = partial * scale
                    if softcap > float32(0.0):
                        score = softcap * math.tanh(score / softcap)
                    p_s[g, c] = score if live else NEG_INF
            cuda.syncthreads()  # the chunk's scores and V rows staged
            for g in range(warp, group, DECODE_WARPS):  # a warp per head, a lane per key
                score = p_s[g, key] if key < CHUNK else NEG_INF
                m_old = ml_s[g, 0]
                m_new = max(m_old, warp_max(score))  # (> -inf: the chunk holds a live key)
                p = math.exp(score - m_new) if score > NEG_INF else float32(0.0)
                total = warp_sum(p)
                if key < CHUNK:
                    p_s[g, key] = p
                if key == 0:
                    rescale = math.exp(m_old - m_new)  # 0 on the first chunk (m_old = -inf)
                    ml_s[g, 0], ml_s[g, 1], ml_s[g, 2] = m_new, ml_s[g, 1] * rescale + total, rescale
            cuda.syncthreads()  # weights and rescales ready
            lo, hi = max(first - c0, 0), min(end - c0, CHUNK)  # the live keys' rows
            for e in range(t, group * head_dim, DECODE_THREADS):
                g, d = e // head_dim, e % head_dim
                a = acc_s[e] * ml_s[g, 2]
                for k in range(lo, hi):
                    a += p_s[g, k] * v_s[k, d]
                acc_s[e] = a
        cuda.syncthreads()  # every accumulator and sum final
        for e in range(t, group * head_dim, DECODE_THREADS):
            g, d = e // head_dim, e % head_dim
            if single:
                out[r, h0 + g, d] = acc_s[e] / ml_s[g, 1]
            else:
                part_acc[i, h0 + g, part, d] = acc_s[e]
        if not single and t < group:
            part_ml[i, h0 + t, part, 0] = ml_s[t, 0]
            part_ml[i, h0 + t, part, 1] = ml_s[t, 1]
    return paged_attention_decode


@cuda.jit(device=True, inline="always")
def _block_reduce(value, scratch, is_max):
    """Max (is_max) or sum of value over the block's threads (MERGE_THREADS): every
    thread gets it. scratch: a shared array of MERGE_WARPS floats."""
    t = cuda.threadIdx.x
    value = warp_max(value) if is_max else warp_sum(value)
    if t % WARP == 0:
        scratch[t // WARP] = value
    cuda.syncthreads()  # each warp's result written
    value = scratch[0]
    for w in range(1, MERGE_WARPS):
        value = max(value, scratch[w]) if is_max else value + scratch[w]
    cuda.syncthreads()  # read by all before scratch is written again
    return value


@cached_kernel()
def merge_partitions(positions, decode_rows, window, part_acc, part_ml, out):
    """Grid (len(decode_rows), n_heads), block MERGE_THREADS: combines the partitions of
    row decode_rows[i], head h, by log-sum-exp: out = sum_p acc_p e^(m_p - M) /
    sum_p l_p e^(m_p - M), M = max_p m_p. The block finds M and the sum together
    (a partition a thread), then thread (d, g) sums dimension d over partitions g,
    g + G, ... (G = MERGE_THREADS // head_dim groups), and the groups' sums are added
    in shared memory. Reads only the partitions the row's context (or window)
    reaches (none for a padding row: zeros)."""
    scratch = cuda.shared.array(MERGE_WARPS, dtype=float32)
    sums = cuda.shared.array(MERGE_THREADS, dtype=float32)
    i, h, t = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    head_dim = out.shape[2]
    r = decode_rows[i]
    n_parts = (positions[r] + PARTITION) // PARTITION  # ceil((position + 1) / PARTITION)
    if n_parts <= 0:  # (the whole block returns)
        for d in range(t, head_dim, MERGE_THREADS):
            out[r, h, d] = float32(0.0)
        return
    first = max(0, positions[r] + 1 - window) // PARTITION if window > 0 else 0
    m_max = NEG_INF
    for p in range(first + t, n_parts, MERGE_THREADS):
        m_max = max(m_max, part_ml[i, h, p, 0])
    m_max = _block_reduce(m_max, scratch, True)
    total = float32(0.0)
    for p in range(first + t, n_parts, MERGE_THREADS):
        total += part_ml[i, h, p, 1] * math.exp(part_ml[i, h, p, 0] - m_max)
    total = _block_reduce(total, scratch, False)
    groups = MERGE_THREADS // head_dim
    d, g = t % head_dim, t // head_dim
    acc = float32(0.0)
    if g < groups:
        for p in range(first + g, n_parts, groups):
            acc += part_acc[i, h, p, d] * math.exp(part_ml[i, h, p, 0] - m_max)
    sums[t] = acc
    cuda.syncthreads()  # every group's sum written
    if g == 0:
        for k in range(1, groups):
            acc += sums[d + k * head_dim]
        out[r, h, d] = acc / total


def _prefill_kernel(kv_value, kv_rows):
    """paged_attention_prefill over a pool read by kv_value and kv_rows (kv_rows.py)."""
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
        block_size = kv_rows(k_cache).shape[1]
        kvh = h // (q.shape[1] // kv_rows(k_cache).shape[2])
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
                    k_s[j, d] = kv_value(k_cache, block, offset, kvh, d)
                    v_s[j, d] = kv_value(v_cache, block, offset, kvh, d)
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
    return paged_attention_prefill


# the kernels per form of the pool (kv_rows.POOL_READS: "" float32 or float16, "q8" int8)
DECODE = {form: _decode_kernel(*reads) for form, reads in POOL_READS.items()}
PREFILL = {form: _prefill_kernel(*reads) for form, reads in POOL_READS.items()}


def launch_decode(launch, args, meta, scale, window, cap, out) -> None:
    """Split-K decode attention through `launch` (the backend's Launcher): a block per
    (row, KV head, partition of PARTITION keys), all of a partition's keys loaded at
    once; partitions merged by log-sum-exp when there are several. args: (q, k_cache,
    v_cache, block_tables, positions, token_seq) as the kernels take them."""
    q, k_cache = args[0], args[1]
    n_rows, n_heads, head_dim = meta.num_decode, q.shape[1], q.shape[2]
    n_kv = layer_rows(k_cache).shape[2]
    group = n_heads // n_kv
    if group > MAX_GROUP:
        raise ValueError(f"a GQA group of {group} query heads per KV head exceeds the "
                         f"decode kernel's MAX_GROUP={MAX_GROUP}")
    parts = meta.decode_partitions
    # (one partition writes out directly; the partials are then placeholders)
    part_acc = launch.empty(n_rows, n_heads, parts, head_dim) if parts > 1 else launch.empty(1, 1, 1, 1)
    part_ml = launch.empty(n_rows, n_heads, parts, 2) if parts > 1 else launch.empty(1, 1, 1, 2)
    launch(DECODE[pool_form(k_cache)], (n_rows, n_kv, parts), DECODE_THREADS, *args,
           meta.decode_rows, scale, window, cap, part_acc, part_ml, out)
    if parts > 1:
        launch(merge_partitions, (n_rows, n_heads), MERGE_THREADS, meta.positions, meta.decode_rows,
               window, part_acc, part_ml, out)

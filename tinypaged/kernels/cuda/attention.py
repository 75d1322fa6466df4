"""CUDA paged decode attention: one query per sequence (prefill: prefill_attention.py).

It reads K/V through the block table: position j of sequence s lives in block
block_tables[s, j // block_size] at offset j % block_size. GQA: query head h uses
KV head h // (n_heads // n_kv). Scores are scaled by `scale` = 1/sqrt(D). With a
sliding window (window > 0), a query at position p sees keys p - window + 1 .. p
only; window 0 means every key up to p. softcap > 0 (Gemma 2) turns each scaled
score s into softcap * tanh(s / softcap). The kernel is built once per form of the
pool (DECODE: kv_rows.POOL_READS): a float32 or float16 pool widened on read, an int8
pool's values times their scales.
"""
import math

import numpy as np
from numba import config, cuda, float32, int32

from .bounded_jit import jit_bounded
from .exact import NEG_INF
from .kv_rows import MAX_HEAD_DIM, POOL_READS, layer_rows, pool_form
from .warp import FULL_MASK, WARP, warp_max, warp_sum

# decode: keys a block loads and scores at once; a partition (a block's keys) is a
# power-of-two count of chunks, chosen per launch (decode_split). The simulator, a
# Python thread per CUDA thread, takes 8: the same code paths on fewer threads
GPU_CHUNK = 32
CHUNK = 8 if config.ENABLE_CUDASIM else GPU_CHUNK
MIN_DECODE_CHUNKS = 2  # decode: the fewest chunks of keys a grid covers (a recorded step
MIN_DECODE_KEYS = MIN_DECODE_CHUNKS * CHUNK  # serves every context up to them: memory.covering_keys)
LANES_PER_KEY = 8  # decode: threads that share one key's dimensions
DECODE_THREADS = CHUNK * LANES_PER_KEY  # 256: a chunk's keys all loaded at once
DECODE_WARPS = DECODE_THREADS // WARP
DIMS_PER_LANE = MAX_HEAD_DIM // LANES_PER_KEY  # a thread's dimensions of its key: d = lane + 8n
MAX_GROUP = 32  # decode: query heads a KV head serves (GQA)
GROUP_DIMS = MAX_GROUP * MAX_HEAD_DIM  # decode: a group's accumulators, in shared memory
# decode: the last block's merge weights, a group's heads x partitions (their sums are
# staged in the V rows' shared memory: CHUNK x MAX_HEAD_DIM words)
MERGE_WEIGHTS = min(2048, CHUNK * MAX_HEAD_DIM)
MERGE_UNROLL = 16  # decode: partitions' partial sums a merging thread loads at once
DECODE_BLOCKS_PER_SM = 2  # decode: registers for 2 blocks an SM (128 a thread); the split counts them
# decode, what decode_split weighs (and tools/step_model.py prices): a chunk's dependent
# loads (K and V: its block ids come while the chunk before it is summed) and its
# barriers and butterflies in sequence; the merge's; a barrier against a round trip
CHUNK_ROUNDS, CHUNK_SYNCS, MERGE_SYNCS, SYNC_ROUNDS = 1, 6, 6, 0.25


def _decode_kernel(kv_value, kv_rows, k_once):
    """paged_attention_decode over a pool read by kv_value and kv_rows (kv_rows.py). k_once:
    a key's K dimensions read into registers once for the group's heads (a float pool:
    that fits 2 blocks an SM; an int8 pool's values and scales then spill, so it reads
    them head by head, from L1)."""
    @jit_bounded((DECODE_THREADS, DECODE_BLOCKS_PER_SM))
    def paged_attention_decode(q, k_cache, v_cache, row_tables, row_positions, decode_rows,
                               scale, window, softcap, partition, part_acc, part_ml,
                               arrivals, out):
        """Split-K, GQA-grouped decode attention, CHUNK keys at once, the partitions
        merged by the last of them to finish.

        Grid (len(decode_rows), n_kv, n_partitions), block DECODE_THREADS: block (i, kvh,
        p) takes query row r = decode_rows[i] (at position row_positions[i], its block
        table row_tables[i]: all read with r, not after it), the `group` query heads that share KV
        head kvh, and keys p * partition ... of r's context (blocks past it exit), a
        chunk of CHUNK keys at a time, each chunk's block ids read while the chunk
        before it is summed. In a chunk, thread t serves key c = t // 8 with dimensions
        e, e + 8, ... (e = t % 8): it loads its V dimensions into shared memory and its K
        dimensions for the group's dot products (no load waits on another: one memory
        latency for the chunk, where a warp walking the keys pays one per key); the 8
        threads of a key reduce by three shuffles; a warp per head updates the head's
        online softmax (lane = key); the block rescales its accumulators and adds the
        chunk's weighted V from shared memory.

        A row whose keys (or window) lie in one partition writes out = acc / l. Else
        each block writes its unnormalised acc (part_acc[i, h, p]) and (max, sum)
        (part_ml[i, h, p]), fences them, and counts itself in arrivals[i, kvh]; the
        block that arrives last merges the row's partitions by log-sum-exp (out =
        sum_p acc_p e^(m_p - M) / sum_p l_p e^(m_p - M), M = max_p m_p) and sets the
        count back to 0 for the next launch: no merge launch, no host step between.
        A padding row (position -1) has no keys: zeros. With a window, partitions
        wholly before it exit (and are not counted), and keys before it weigh 0.
        """
        v_s = cuda.shared.array((CHUNK, MAX_HEAD_DIM), dtype=float32)
        p_s = cuda.shared.array((MAX_GROUP, CHUNK), dtype=float32)  # scores, then weights
        ml_s = cuda.shared.array((MAX_GROUP, 3), dtype=float32)  # a head's (max, sum, rescale)
        acc_s = cuda.shared.array(GROUP_DIMS, dtype=float32)  # [g * head_dim + d]
        w_s = cuda.shared.array(MERGE_WEIGHTS, dtype=float32)  # the merge's [g * live + p]
        last_s = cuda.shared.array(1, dtype=int32)  # this block arrived last
        k_vals = cuda.local.array(DIMS_PER_LANE, dtype=float32)
        t = cuda.threadIdx.x
        i, kvh, part = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
        c, lane = t // LANES_PER_KEY, t % LANES_PER_KEY
        r = decode_rows[i]
        head_dim, block_size = q.shape[2], kv_rows(k_cache).shape[1]
        start = part * partition
        # the first chunk's block id, loaded with the row's position (one round trip for
        # both; the table's last column where the grid covers more keys than it holds)
        next_block = row_tables[i, min((start + c) // block_size, row_tables.shape[1] - 1)]
        group = q.shape[1] // kv_rows(k_cache).shape[2]
        h0 = kvh * group  # the group's first query head
        n_keys = row_positions[i] + 1
        first = max(0, n_keys - window) if window > 0 else 0  # the window's first key
        first_part = first // partition
        # partitions with live keys (those the grid covers: a recorded step's grid is
        # chosen for its contexts, memory.covering_keys)
        live_parts = min((n_keys - 1) // partition, cuda.gridDim.z - 1) - first_part + 1
        if start >= n_keys:  # (the whole block returns: no barrier is left waiting)
            if n_keys <= 0 and part == 0:  # a padding row
                for e in range(t, group * head_dim, DECODE_THREADS):
                    out[r, h0 + e // head_dim, e % head_dim] = float32(0.0)
            return
        if part < first_part:  # wholly before the window
            return
        for e in range(t, group * head_dim, DECODE_THREADS):
            acc_s[e] = float32(0.0)
        if t < group:
            ml_s[t, 0], ml_s[t, 1] = NEG_INF, float32(0.0)
        warp, key = t // WARP, t % WARP
        end = min(start + partition, n_keys)
        c_first = max(start, first - first % CHUNK)  # the first chunk with live keys
        if c_first > start and first <= c_first + c < end:  # (a window starts inside: again)
            next_block = row_tables[i, (c_first + c) // block_size]
        for c0 in range(c_first, end, CHUNK):
            j = c0 + c
            live = first <= j < end
            block, offset = next_block, j % block_size
            if j + CHUNK < end:  # (the next chunk's block id, in flight while this one is summed)
                next_block = row_tables[i, (j + CHUNK) // block_size]
            cuda.syncthreads()  # the last chunk's weights and V rows are read
            if live:
                for n in range(DIMS_PER_LANE):  # (a constant count: unrolled, loads in flight)
                    d = lane + LANES_PER_KEY * n
                    if d < head_dim:
                        v_s[c, d] = kv_value(v_cache, block, offset, kvh, d)
            if k_once:  # this key's dimensions, read once for the group
                for n in range(DIMS_PER_LANE):
                    d = lane + LANES_PER_KEY * n
                    k_vals[n] = kv_value(k_cache, block, offset, kvh, d) if live and d < head_dim \
                        else float32(0.0)
            for g in range(group):
                partial = float32(0.0)
                if live:
                    for n in range(DIMS_PER_LANE):
                        d = lane + LANES_PER_KEY * n
                        if d < head_dim:
                            k_d = k_vals[n] if k_once else kv_value(k_cache, block, offset, kvh, d)
                            partial += q[r, h0 + g, d] * k_d
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
        if live_parts == 1:
            for e in range(t, group * head_dim, DECODE_THREADS):
                out[r, h0 + e // head_dim, e % head_dim] = acc_s[e] / ml_s[e // head_dim, 1]
            return
        for e in range(t, group * head_dim, DECODE_THREADS):
            part_acc[i, h0 + e // head_dim, part, e % head_dim] = acc_s[e]
        if t < group:
            part_ml[i, h0 + t, part, 0] = ml_s[t, 0]
            part_ml[i, h0 + t, part, 1] = ml_s[t, 1]
        cuda.threadfence()  # this block's partials reach every block before it is counted
        cuda.syncthreads()  # every thread's partials written and fenced
        if t == 0:
            last_s[0] = cuda.atomic.add(arrivals, (i, kvh), 1) == live_parts - 1
        cuda.syncthreads()  # the count read
        if last_s[0] == 0:
            return
        _merge(i, r, h0, group, head_dim, first_part, live_parts, part_acc, part_ml, w_s, v_s, ml_s, out)
        if t == 0:
            arrivals[i, kvh] = 0  # (the next launch counts from zero)
    return paged_attention_decode


@cuda.jit(device=True, inline="always")  # (NVVM-inlined, `ahead` spilled 256 bytes)
def _merge(i, r, h0, group, head_dim, first_part, live_parts, part_acc, part_ml, w_s, sums_s,
           ml_s, out):
    """The last block's merge of row r's live partitions for the group's heads (see
    paged_attention_decode): weights e^(m_p - M) in w_s, each head's total in ml_s. The
    maxima and sums are staged (sums_s: the V rows' shared memory, free now) while each
    thread's first MERGE_UNROLL partial sums are loaded: one round trip for all three."""
    t = cuda.threadIdx.x
    warp, lane = t // WARP, t % WARP
    ahead = cuda.local.array(MERGE_UNROLL, dtype=float32)  # thread t's element's partials
    if t < group * head_dim:
        for u in range(MERGE_UNROLL):  # (a constant count: unrolled, loads in flight)
            if u < live_parts:
                ahead[u] = part_acc[i, h0 + t // head_dim, first_part + u, t % head_dim]
    for e in range(t, group * live_parts, DECODE_THREADS):
        g, p = e // live_parts, first_part + e % live_parts
        w_s[e] = part_ml[i, h0 + g, p, 0]
        sums_s[e // MAX_HEAD_DIM, e % MAX_HEAD_DIM] = part_ml[i, h0 + g, p, 1]
    cuda.syncthreads()  # the partitions' maxima and sums staged
    for g in range(warp, group, DECODE_WARPS):  # a warp per head, a lane per partition
        row = g * live_parts
        m_max = NEG_INF
        for p in range(lane, live_parts, WARP):
            m_max = max(m_max, w_s[row + p])
        m_max = warp_max(m_max)
        total = float32(0.0)
        for p in range(lane, live_parts, WARP):
            weight = math.exp(w_s[row + p] - m_max)
            w_s[row + p] = weight
            e = row + p
            total += weight * sums_s[e // MAX_HEAD_DIM, e % MAX_HEAD_DIM]
        total = warp_sum(total)
        if lane == 0:
            ml_s[g, 1] = total
    cuda.syncthreads()  # weights and totals ready
    for e in range(t, group * head_dim, DECODE_THREADS):
        g, d = e // head_dim, e % head_dim
        acc = float32(0.0)
        for p0 in range(0, live_parts, MERGE_UNROLL):
            for u in range(MERGE_UNROLL):  # (a constant count: unrolled, loads in flight)
                p = p0 + u
                if p < live_parts:
                    value = ahead[u] if e == t and p0 == 0 else part_acc[i, h0 + g, first_part + p, d]
                    acc += value * w_s[g * live_parts + p]
        out[r, h0 + g, d] = acc / ml_s[g, 1]


# the kernel per form of the pool (kv_rows.POOL_READS: "" float32 or float16, "q8" int8)
DECODE = {form: _decode_kernel(*reads, k_once=form == "") for form, reads in POOL_READS.items()}


def merge_rounds(parts: int) -> int:
    """Dependent memory round trips of the last block's merge over `parts` partitions:
    the fence, the arrival count, the maxima and sums with a thread's first
    MERGE_UNROLL partial sums, then MERGE_UNROLL more at a time."""
    return 0 if parts == 1 else 2 + -(-parts // MERGE_UNROLL)


def decode_block_cost(chunks: int, parts: int) -> tuple[int, int]:
    """(dependent round trips, barriers and butterflies in sequence) of a decode block
    that walks `chunks` chunks of a row split into `parts` partitions: the row's
    position, its first block id, the chunks, the merge."""
    rounds = 1 + CHUNK_ROUNDS * chunks + merge_rounds(parts)
    return rounds, CHUNK_SYNCS * chunks + 1 + (MERGE_SYNCS if parts > 1 else 0)


def decode_split(rows: int, n_kv: int, group: int, keys: int, sms: int,
                 chunk: int = CHUNK) -> tuple[int, int]:
    """(partitions, keys a partition) for a decode grid over contexts of up to `keys`
    keys (a power of two: memory.covering_keys): the split whose blocks finish first
    (decode_block_cost, wave after wave) when DECODE_BLOCKS_PER_SM blocks occupy an SM
    (their registers: tools/resources.py). So at batch 1 a long context is split until
    the blocks fill the SMs; a large batch keeps longer partitions. Ties go to fewer partitions; the
    merge's weights must fit MERGE_WEIGHTS. (chunk: the kernel's CHUNK; the step model
    asks for a GPU's on the simulator.)"""
    best = None
    partition = chunk
    while True:
        parts = max(1, keys // partition)
        if group * parts <= MERGE_WEIGHTS:
            rounds, syncs = decode_block_cost(partition // chunk, parts)
            cost = -(-rows * n_kv * parts // (sms * DECODE_BLOCKS_PER_SM)) * (rounds + syncs * SYNC_ROUNDS)
            if best is None or cost <= best[0]:
                best = (cost, parts, partition)
        if partition >= keys:
            return best[1], best[2]
        partition *= 2


def launch_decode(launch, args, meta, scale, window, cap, out) -> None:
    """Split-K decode attention through `launch` (the backend's Launcher): a block per
    (row, KV head, partition), all of a chunk's keys loaded at once; the partitions
    split as decode_split finds fastest for the launch's rows and contexts, merged by
    the last block of each row and KV head. args: (q, k_cache, v_cache, block_tables,
    positions, token_seq) as the prefill kernel takes them; the decode kernel takes the
    first three, then its rows' block tables and positions (meta.decode_tables,
    decode_positions)."""
    q, k_cache = args[0], args[1]
    n_rows, n_heads, head_dim = meta.num_decode, q.shape[1], q.shape[2]
    n_kv = layer_rows(k_cache).shape[2]
    group = n_heads // n_kv
    if group > MAX_GROUP:
        raise ValueError(f"a GQA group of {group} query heads per KV head exceeds the "
                         f"decode kernel's MAX_GROUP={MAX_GROUP}")
    parts, partition = decode_split(n_rows, n_kv, group, meta.decode_keys, launch.sms)
    # (one partition writes out directly; the partials are then placeholders)
    part_acc = launch.empty(n_rows, n_heads, parts, head_dim) if parts > 1 else launch.empty(1, 1, 1, 1)
    part_ml = launch.empty(n_rows, n_heads, parts, 2) if parts > 1 else launch.empty(1, 1, 1, 2)
    launch(DECODE[pool_form(k_cache)], (n_rows, n_kv, parts), DECODE_THREADS, *args[:3],
           meta.decode_tables, meta.decode_positions, meta.decode_rows, scale, window, cap,
           np.int32(partition), part_acc, part_ml, launch.arrival_counts(n_rows, n_kv), out)

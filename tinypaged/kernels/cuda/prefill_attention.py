"""CUDA paged prefill attention: flash-style, a block per (tile of up to Q_TILE query
rows of one sequence, query head), walking that sequence's keys a tile at a time
through its block table (a cached prefix is read like new tokens).

Position j of a sequence lives in block block_tables[s, j // block_size] at offset
j % block_size; query head h reads KV head h // (n_heads // n_kv). Scores are scaled
by `scale`; softcap > 0 turns a score s into softcap tanh(s / softcap); a query at
position p sees keys up to p, and with window > 0 only p - window + 1 .. p.

Register patches, as in tiled_matmul.py: thread (kl, rl) = (t % KEY_LANES,
t // KEY_LANES) owns query rows rl + ROW_LANES i. It scores them against keys
kl + KEY_LANES j (THREAD_ROWS x keys scores from THREAD_ROWS + keys shared loads a
dimension) and accumulates their outputs at dimensions kl + KEY_LANES c. A row's online softmax
(max, sum) meets across its KEY_LANES lanes in shuffle butterflies, so the
correction of its accumulators stays in registers; the probabilities go through
shared memory to the weighted sum. A thread stages one key of each tile; the next
tile's block id is read while this tile is summed, so its K and V wait one round
trip. A kernel is built per widest head it takes (64 or 128: the shared arrays' widths).
"""
import math

from numba import config, cuda, float32

from .bounded_jit import jit_bounded
from .device_function import device_function
from .exact import NEG_INF
from .kv_rows import MAX_HEAD_DIM, POOL_READS, pool_form
from .warp import lanes_max, lanes_sum

# query rows a block takes, its threads, the lanes a row's keys (and its output's
# dimensions) are spread over, and keys a tile by the widest head a kernel takes (the
# 48 KB of static shared memory: 29 KB for 64-wide heads, 35 KB for 128): a GPU's
# (tools/step_model.py prices them) and the simulator's (one warp, the same paths)
GPU_Q_TILE, GPU_PREFILL_THREADS, GPU_KEY_LANES, GPU_KV_TILES = 32, 128, 16, {64: 32, 128: 16}
Q_TILE, PREFILL_THREADS, KEY_LANES, KV_TILES = (
    (16, 32, 4, {64: 8, 128: 4}) if config.ENABLE_CUDASIM
    else (GPU_Q_TILE, GPU_PREFILL_THREADS, GPU_KEY_LANES, GPU_KV_TILES))
ROW_LANES = PREFILL_THREADS // KEY_LANES
THREAD_ROWS = Q_TILE // ROW_LANES  # query rows a thread owns (4 on a GPU)
# 3 blocks an SM: up to 168 registers a thread (a tile's 32 K and V loads in flight, the
# 4 x 8 sums of a 128-wide head); at 4 (128 registers) the int8 pool and 128-wide heads spill
PREFILL_BLOCKS_PER_SM = 3
assert max(KV_TILES) == MAX_HEAD_DIM


def head_width(head_dim: int) -> int:
    """The kernel (by the widest head it takes) that serves heads of head_dim."""
    return min(w for w in KV_TILES if w >= head_dim)


def launch_prefill(launch, args, meta, scale, window, cap, out) -> None:
    """The prefill tiles' attention through `launch` (the backend's Launcher): args as
    attention.launch_decode takes them, the kernel for the pool's form and head width."""
    q, k_cache = args[0], args[1]
    kernel = PREFILL[pool_form(k_cache), head_width(q.shape[2])]
    launch(kernel, (meta.num_tiles, q.shape[1]), PREFILL_THREADS, *args, meta.prefill_tiles,
           scale, window, cap, out)


def _prefill_kernel(kv_value, kv_rows, width):
    """paged_attention_prefill over a pool read by kv_value and kv_rows (kv_rows.py), for
    heads of up to `width` dimensions."""
    kv_tile = KV_TILES[width]
    keys = kv_tile // KEY_LANES  # keys a thread scores for each of its rows (2 or 1)
    dims = width // KEY_LANES  # output dimensions a thread sums (4 or 8)
    key_lanes = PREFILL_THREADS // kv_tile  # threads that stage one key's K and V
    kv_loads = width // key_lanes  # K (and V) values a thread stages a tile
    padded = width + 1  # q and k rows: a warp's keys at one d in as many banks

    @device_function
    def key_block(block_tables, s, pos, end, block_size):
        """The pool block that holds key `pos` of sequence s (0 past `end`)."""
        return block_tables[s, pos // block_size] if pos < end else 0

    @device_function
    def stage_keys(k_cache, v_cache, block, pos, end, kvh, head_dim, k_s, v_s):
        """This thread's share of a key tile into shared memory: key `pos` (in `block`),
        its dimensions t % key_lanes + key_lanes n (a key's lanes read consecutive
        words), zeros past `end` and head_dim."""
        t = cuda.threadIdx.x
        j, lane = t // key_lanes, t % key_lanes
        offset = pos % kv_rows(k_cache).shape[1]
        for n in range(kv_loads):
            d = lane + key_lanes * n
            live = pos < end and d < head_dim
            k_s[j, d] = kv_value(k_cache, block, offset, kvh, d) if live else float32(0.0)
            v_s[j, d] = kv_value(v_cache, block, offset, kvh, d) if live else float32(0.0)

    @jit_bounded((PREFILL_THREADS, PREFILL_BLOCKS_PER_SM))
    def paged_attention_prefill(q, k_cache, v_cache, block_tables, positions, token_seq,
                                prefill_tiles, scale, window, softcap, out):
        """Grid (len(prefill_tiles), n_heads), block PREFILL_THREADS. Tile i holds query
        rows r0 .. r0 + nq - 1 (prefill_tiles[i] = (r0, nq), nq <= Q_TILE) of one
        sequence at consecutive positions p0 .. p0 + nq - 1; the block walks keys from
        the tile holding the first query's first key (its window's) to p0 + nq - 1."""
        q_s = cuda.shared.array((Q_TILE, padded), dtype=float32)
        k_s = cuda.shared.array((kv_tile, padded), dtype=float32)
        v_s = cuda.shared.array((kv_tile, width), dtype=float32)
        p_s = cuda.shared.array((Q_TILE, kv_tile), dtype=float32)  # a tile's probabilities
        acc = cuda.local.array((THREAD_ROWS, dims), dtype=float32)
        score = cuda.local.array((THREAD_ROWS, keys), dtype=float32)
        m = cuda.local.array(THREAD_ROWS, dtype=float32)  # each row's running max
        total = cuda.local.array(THREAD_ROWS, dtype=float32)  # and its sum of e^(score - max)
        a = cuda.local.array(THREAD_ROWS, dtype=float32)
        b = cuda.local.array(dims, dtype=float32)
        t, h = cuda.threadIdx.x, cuda.blockIdx.y
        kl, rl = t % KEY_LANES, t // KEY_LANES
        r0, nq = prefill_tiles[cuda.blockIdx.x, 0], prefill_tiles[cuda.blockIdx.x, 1]
        head_dim = q.shape[2]
        kvh = h // (q.shape[1] // kv_rows(k_cache).shape[2])
        s, p0 = token_seq[r0], positions[r0]
        end = p0 + nq
        lowest = max(0, p0 - window + 1) if window > 0 else 0  # the first query's first key
        first = lowest - lowest % kv_tile
        for e in range(t, Q_TILE * head_dim, PREFILL_THREADS):
            qi, d = e // head_dim, e % head_dim
            q_s[qi, d] = q[r0 + qi, h, d] if qi < nq else float32(0.0)
        for i in range(THREAD_ROWS):
            m[i], total[i] = NEG_INF, float32(0.0)
            for c in range(dims):
                acc[i, c] = float32(0.0)

        block_size = kv_rows(k_cache).shape[1]
        my_key = t // key_lanes  # the key of each tile this thread stages
        block = key_block(block_tables, s, first + my_key, end, block_size)
        for k0 in range(first, end, kv_tile):
            stage_keys(k_cache, v_cache, block, k0 + my_key, end, kvh, head_dim, k_s, v_s)
            cuda.syncthreads()  # the key tile (and the first time, the queries) staged
            # the next tile's block id goes out now: its K and V then wait one round trip
            block = key_block(block_tables, s, k0 + kv_tile + my_key, end, block_size)
            for i in range(THREAD_ROWS):
                for j in range(keys):
                    score[i, j] = float32(0.0)
            for d in range(head_dim):
                for i in range(THREAD_ROWS):
                    a[i] = q_s[rl + ROW_LANES * i, d]
                for j in range(keys):
                    b[j] = k_s[kl + KEY_LANES * j, d]
                for i in range(THREAD_ROWS):
                    for j in range(keys):
                        score[i, j] += a[i] * b[j]
            for i in range(THREAD_ROWS):
                qi = rl + ROW_LANES * i
                tile_max = NEG_INF
                for j in range(keys):
                    key = k0 + kl + KEY_LANES * j
                    value = score[i, j] * scale
                    if softcap > float32(0.0):
                        value = softcap * math.tanh(value / softcap)
                    # causal (key position <= query position), and inside the window
                    seen = qi < nq and key <= p0 + qi and (window <= 0 or key > p0 + qi - window)
                    score[i, j] = value if seen else NEG_INF
                    tile_max = max(tile_max, score[i, j])
                m_new = max(m[i], lanes_max(tile_max, KEY_LANES))
                corr = math.exp(m[i] - m_new) if m_new > NEG_INF else float32(0.0)
                tile_sum = float32(0.0)
                for j in range(keys):
                    p = math.exp(score[i, j] - m_new) if m_new > NEG_INF else float32(0.0)
                    p_s[qi, kl + KEY_LANES * j] = p
                    tile_sum += p
                total[i] = total[i] * corr + lanes_sum(tile_sum, KEY_LANES)
                m[i] = m_new
                for c in range(dims):
                    acc[i, c] *= corr
            cuda.syncthreads()  # the tile's probabilities written
            for j in range(kv_tile):
                for i in range(THREAD_ROWS):
                    a[i] = p_s[rl + ROW_LANES * i, j]
                for c in range(dims):
                    b[c] = v_s[j, kl + KEY_LANES * c] if kl + KEY_LANES * c < head_dim else float32(0.0)
                for i in range(THREAD_ROWS):
                    for c in range(dims):
                        acc[i, c] += a[i] * b[c]
            cuda.syncthreads()  # everyone has read k_s, v_s and p_s before the next tile

        for i in range(THREAD_ROWS):
            qi = rl + ROW_LANES * i
            if qi < nq:
                for c in range(dims):
                    d = kl + KEY_LANES * c
                    if d < head_dim:
                        out[r0 + qi, h, d] = acc[i, c] / total[i]
    return paged_attention_prefill


# the kernels per form of the pool (kv_rows.POOL_READS: "" float32 or float16, "q8" int8)
# and widest head
PREFILL = {(form, width): _prefill_kernel(*reads, width) for form, reads in POOL_READS.items()
           for width in KV_TILES}

"""CPU paged attention (numba): query tiles against key splits, merged.

A batch mixes decode tokens (one per sequence) and prefill chunks (consecutive
positions of one sequence). Its tokens are cut into tiles: up to `tile` consecutive
tokens of one sequence, so that each K/V row a tile reads serves all of its tokens
and all the query heads of their KV head (rows = tokens x group). A tile's keys
(from the first key its first token sees to its last token's position) are cut into
splits of SPLIT_KEYS, and each (tile, KV head, split) is one work item
(attention_items.py), dealt round-robin to the threads: a batch-1 decode over a long
context runs on both cores as a long prefill does (flash decoding). An item of an
unsplit tile writes its rows' outputs; those of a split tile write their partial
max, sum and weighted V, and a merge pass combines them.

Traffic a step: each tile reads its keys' K and V rows once per KV head (a decode
token: its context once, float16 widened as read); prefill arithmetic is rows x keys
x D twice.

Batches whose products run in BLAS's threads (float weights, more than
NUMBA_MAX_ROWS tokens) run the items on this thread only: numba's OpenMP workers
and OpenBLAS's threads both spin after their work, and alternating them on two
cores cost milliseconds (linear.blas_in_use says which).
"""
import numpy as np
from numba import float32, get_num_threads, prange, set_num_threads, typeof, types

from ...jit_cache import cached_njit
from .attention_items import FEW_ROWS, KEYS, NO_SCORE, attend_few, attend_many
from .address_call import call_entry, run_at_address
from .common import N_CHUNKS
from .fast_exp import exp32
from .linear import blas_in_use

SPLIT_KEYS = 512  # keys a work item at most (a few-row item's scores fit in L1)
QUERY_TILE_FLOATS = 4096  # a tile's rows x D at most (its q and its sums stay in L1 / L2)
MAX_TILE = 16  # tokens a tile at most


def tile_tokens(n_heads: int, n_kv: int, head_dim: int) -> int:
    """Tokens a tile: as many as keep rows x D within QUERY_TILE_FLOATS, 1 to MAX_TILE."""
    return max(1, min(MAX_TILE, QUERY_TILE_FLOATS // (n_heads // n_kv * head_dim)))


@cached_njit()
def _plan(positions, token_seq, window, tile, split):
    """Tiles (first token, tokens, first key) and work items (tile, kv-head-free split
    index, first key, end key, partial slot or -1), as arrays."""
    n = len(positions)
    starts, lens, first_keys = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    n_tiles, t = 0, 0
    while t < n:
        end = t + 1
        while end < n and end - t < tile and token_seq[end] == token_seq[t] \
                and positions[end] == positions[end - 1] + 1:
            end += 1
        starts[n_tiles], lens[n_tiles] = t, end - t
        first_keys[n_tiles] = max(0, positions[t] - window + 1) if window > 0 else 0
        n_tiles += 1
        t = end
    n_items, n_partials = 0, 0
    for i in range(n_tiles):
        keys = positions[starts[i] + lens[i] - 1] + 1 - first_keys[i]
        splits = -(-keys // split)
        n_items += splits
        if splits > 1:
            n_partials += splits * lens[i]
    items = np.empty((n_items, 5), np.int64)  # tile, first key, end key, partial row or -1, splits
    at, partial = 0, 0
    for i in range(n_tiles):
        end_key = positions[starts[i] + lens[i] - 1] + 1
        splits = -(-(end_key - first_keys[i]) // split)
        for s in range(splits):
            k0 = first_keys[i] + s * split
            items[at, 0], items[at, 1], items[at, 2] = i, k0, min(end_key, k0 + split)
            items[at, 3] = partial if splits > 1 else -1
            items[at, 4] = splits
            if splits > 1:
                partial += lens[i]
            at += 1
    return starts[:n_tiles], lens[:n_tiles], items, n_partials


@cached_njit(fastmath=True, error_model="numpy")
def _run_chunk(c, chunks, q, k_cache, v_cache, block_tables, positions, token_seq, scale, window,
               softcap, split, starts, lens, items, own, rows, out, part_top, part_total,
               part_acc):
    """Work items c, c + chunks, ... (each (item, KV head)), with `own` as scratch:
    each writes its rows' outputs, or its partials for the merge."""
    n_heads, head_dim = q.shape[1], q.shape[2]
    n_kv = v_cache.shape[2]
    group = n_heads // n_kv
    # own: q_t, kbuf, vbuf, scores, acc, best, top, total, lanes, block_scores
    q_t, at = own[:head_dim * max(rows, FEW_ROWS)], head_dim * max(rows, FEW_ROWS)
    kbuf = own[at:at + KEYS * head_dim].reshape(KEYS, head_dim)
    kbuf[:, :] = 0.0  # (score_tile reads whole passes of 8 keys: finite values)
    at += KEYS * head_dim
    vbuf = own[at:at + KEYS * head_dim].reshape(KEYS, head_dim)
    at += KEYS * head_dim
    n_scores = max(KEYS * rows, FEW_ROWS * split)
    scores, acc_rows = own[at:at + n_scores], own[at + n_scores:at + n_scores + rows * head_dim]
    at += n_scores + rows * head_dim
    best, top, total = own[at:at + rows], own[at + rows:at + 2 * rows], own[at + 2 * rows:at + 3 * rows]
    lanes = own[at + 3 * rows:at + 3 * rows + 16]
    at += 3 * rows + 16
    block_scores = own[at:at + FEW_ROWS * 16].reshape(FEW_ROWS, 16)
    for w in range(c, len(items) * n_kv, chunks):
        item, kvh = w // n_kv, w % n_kv
        i, k0, k1, partial = items[item, 0], items[item, 1], items[item, 2], items[item, 3]
        t0, n_tok = starts[i], lens[i]
        table = block_tables[token_seq[t0]]
        n_rows = n_tok * group
        if n_rows < FEW_ROWS:
            acc = acc_rows[:n_rows * head_dim].reshape(n_rows, head_dim)
            attend_few(q, k_cache, v_cache, table, positions, t0, n_tok, kvh, k0, k1, scale,
                       window, softcap, q_t[:n_rows * head_dim].reshape(n_rows, head_dim),
                       kbuf, block_scores, scores[:FEW_ROWS * split].reshape(FEW_ROWS, split),
                       lanes, top, total, acc)
        else:
            padded = -(-n_rows // 16) * 16
            acc = acc_rows[:padded * head_dim].reshape(padded, head_dim)
            attend_many(q, k_cache, v_cache, table, positions, t0, n_tok, kvh, k0, k1, scale,
                        window, softcap, q_t[:head_dim * padded].reshape(head_dim, padded),
                        kbuf, vbuf, scores[:KEYS * padded].reshape(KEYS, padded), best, top,
                        total, acc)
        for r in range(n_rows):
            t, h = r // group, kvh * group + r % group
            if partial < 0:
                inv = float32(1.0) / total[r]
                for d in range(head_dim):
                    out[t0 + t, h, d] = acc[r, d] * inv
            else:
                part_top[partial + t, h], part_total[partial + t, h] = top[r], total[r]
                for d in range(head_dim):
                    part_acc[partial + t, h, d] = acc[r, d]


@cached_njit(fastmath=True, error_model="numpy")
def _merge(item, starts, lens, items, part_top, part_total, part_acc, out):
    """The output rows of a split tile (item: its first) from its splits' partials."""
    i, partial, splits = items[item, 0], items[item, 3], items[item, 4]
    t0, n_tok = starts[i], lens[i]
    for t in range(n_tok):
        for h in range(out.shape[1]):
            best = NO_SCORE
            for s in range(splits):
                best = max(best, part_top[partial + s * n_tok + t, h])
            total = float32(0.0)
            row = out[t0 + t, h]
            row[:] = 0.0
            for s in range(splits):
                at = partial + s * n_tok + t
                if part_total[at, h] > 0:
                    f = exp32(part_top[at, h] - best)
                    total += f * part_total[at, h]
                    part = part_acc[at, h]
                    for d in range(row.shape[0]):
                        row[d] += f * part[d]
            inv = float32(1.0) / total
            for d in range(row.shape[0]):
                row[d] *= inv


@cached_njit(fastmath=True, parallel=True, error_model="numpy")
def _paged_attention(q, k_cache, v_cache, block_tables, positions, token_seq, scale, window,
                     softcap, tile, split, out, run_chunk):
    """The work items in N_CHUNKS round-robin shares on numba's threads (_run_chunk,
    called at its address run_chunk: address_call.py), then the merges. False, with
    nothing done, where run_chunk was compiled for other types."""
    chunks = N_CHUNKS
    n_heads, head_dim = q.shape[1], q.shape[2]
    n_kv = v_cache.shape[2]
    group = n_heads // n_kv
    starts, lens, items, n_partials = _plan(positions, token_seq, window, tile, split)
    part_top = np.empty((n_partials, n_heads), np.float32)
    part_total = np.empty((n_partials, n_heads), np.float32)
    part_acc = np.empty((n_partials, n_heads, head_dim), np.float32)
    chunks = max(1, min(chunks, len(items) * n_kv))  # (the threads take equal runs of chunks)
    rows = -(-tile * group // 16) * 16  # a tile's rows, padded to whole vectors
    # each chunk's scratch, one allocation for all (9 a chunk cost a decode step ~20 us)
    per_chunk = (head_dim * max(rows, FEW_ROWS) + 2 * KEYS * head_dim
                 + max(KEYS * rows, FEW_ROWS * split) + rows * head_dim + 3 * rows + 16
                 + FEW_ROWS * 16)
    scratch = np.empty((chunks, per_chunk), np.float32)
    done = np.empty(chunks, np.bool_)
    for c in prange(chunks):  # work items dealt round-robin: long and short ones mix
        done[c] = call_entry(run_chunk, (np.int64(c), chunks, q, k_cache, v_cache, block_tables, positions,
                                          token_seq, scale, window, softcap, split, starts, lens, items,
                                          scratch[c], rows, out, part_top, part_total, part_acc))
    if not done.all():
        return False
    for item in range(len(items)):  # merge each split tile's partials (at its first item)
        if items[item, 3] >= 0 and (item == 0 or items[item - 1, 0] != items[item, 0]):
            _merge(item, starts, lens, items, part_top, part_total, part_acc, out)
    return True


def paged_attention(q, k_cache, v_cache, meta, window=None, scores_scale=None, softcap=None,
                    split_keys=SPLIT_KEYS):
    """q (T, n_heads, D) -> (T, n_heads, D); see kernels/reference.paged_attention.
    split_keys: keys a work item at most (tests make splits on short contexts)."""
    out = np.empty_like(q)
    n_heads, head_dim = q.shape[1], q.shape[2]
    scale = np.float32(1.0 / np.sqrt(head_dim) if scores_scale is None else scores_scale)
    args = (q, k_cache, v_cache, meta.block_tables, meta.positions, meta.token_seq, scale,
            window or 0, np.float32(softcap or 0.0), tile_tokens(n_heads, v_cache.shape[2], head_dim),
            split_keys, out)
    if not blas_in_use():  # (numba's thread-count calls take a lock: ~5 us a pair)
        _attend(args)
        return out
    threads = get_num_threads()
    set_num_threads(1)  # one thread: no numba workers woken between BLAS calls
    try:
        _attend(args)
    finally:
        set_num_threads(threads)
    return out


_RUN_CHUNK_ENTRIES: dict = {}  # (the pool's K and V dtypes) -> _run_chunk's entry


def _attend(args) -> None:
    """_paged_attention(*args) with _run_chunk's entry for args' types: found by the
    pool's dtypes (what differs between models; numba's typeof takes ~6 us an array),
    or where that entry's types differ (another layout of q, say), compiled anew."""
    run_at_address(_paged_attention, args, _run_chunk, _RUN_CHUNK_ENTRIES, (args[1].dtype.num, args[2].dtype.num),
                   _run_chunk_types)


def _run_chunk_types(args) -> tuple:
    """The numba types of the arguments _paged_attention(*args) passes _run_chunk."""
    q, k_cache, v_cache, block_tables, positions, token_seq, *_, out = map(typeof, args)
    index, floats = types.int64, types.float32
    vector, matrix = types.Array(index, 1, "C"), types.Array(index, 2, "C")
    return (index, index, q, k_cache, v_cache, block_tables, positions, token_seq, floats, index,
            floats, index, vector, vector, matrix, types.Array(floats, 1, "C"), index, out,
            types.Array(floats, 2, "C"), types.Array(floats, 2, "C"), types.Array(floats, 3, "C"))

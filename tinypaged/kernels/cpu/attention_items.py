"""One work item of CPU paged attention (attention.py): a tile's rows (its tokens x the
query heads of one KV head) against a range of keys. Each leaves, per row, the max
score (top), the sum of e^(score - top) (total) and the sum of those weights times V
(acc), for the caller to divide or to merge with other key ranges.

Few rows (a decode token's group): two passes over the range, every loop vectorised
over keys or D: the scores of all its keys (a split's fit in L1; a block's 16 keys a
vector, read as the pool holds K, transposed: attention_ir.key_scores), their max and
weights, then V. Many rows (a prefill tile): KEYS keys at a time with an online
softmax, every loop vectorised over rows (q transposed once), so each K/V row read
serves the whole tile. (The pools' layouts: cache_ops.py.)
"""
import numpy as np
from numba import float32, njit, types
from numba.extending import overload

from ..kv_q8 import KV_BLOCK
from .attention_ir import BLOCKS_A_PASS, key_scores, score_tile, weigh_keys, weigh_values
from .common import f16_bits_to_f32, kv_widen
from .fast_exp import exp32
from .vector_ir import LANES

NO_SCORE = float32(-3.0e38)  # a masked score; finite, as fastmath assumes no infinities
KEYS = 16  # keys a pass of the many-row item
FEW_ROWS = 8  # fewer rows than this take the two-pass item
assert BLOCKS_A_PASS == 4, "attend_few hands key_scores a tuple of 4 blocks"


def _widen_row(pool, block, offset, kvh, row):
    """One key's D values of this KV head from the V pool, as float32, into row (L1)."""


def _widen_key(pool, block, offset, kvh, row):
    """One key's D values of this KV head from the K pool (transposed: the key's
    column), as float32, into row (L1)."""


@njit(fastmath=True, inline="always")
def _widen_q8(values, row):
    """A kv_q8.py row (D values, then D/16 bytes of scales; a strided view of the pool
    may hold it) as its D float32 values, into row."""
    head_dim = row.shape[0]
    for c in range(head_dim // KV_BLOCK):
        bits = (np.int32(values[head_dim + 2 * c]) & 255) | ((np.int32(values[head_dim + 2 * c + 1]) & 255) << 8)
        scale = f16_bits_to_f32(np.uint16(bits))
        for d in range(c * KV_BLOCK, (c + 1) * KV_BLOCK):
            row[d] = float32(values[d]) * scale


@overload(_widen_row, inline="always")
def _widen_row_of(pool, block, offset, kvh, row):
    if pool.dtype == types.int8:
        return lambda pool, block, offset, kvh, row: _widen_q8(pool[block, offset, kvh], row)

    def widen(pool, block, offset, kvh, row):
        for d in range(row.shape[0]):
            row[d] = kv_widen(pool[block, offset, kvh, d])
    return widen


@overload(_widen_key, inline="always")
def _widen_key_of(pool, block, offset, kvh, row):
    if pool.dtype == types.int8:
        return lambda pool, block, offset, kvh, row: _widen_q8(pool[block, kvh, :, offset], row)

    def widen(pool, block, offset, kvh, row):
        for d in range(row.shape[0]):
            row[d] = kv_widen(pool[block, kvh, d, offset])
    return widen


@njit(fastmath=True, inline="always")
def _max_of(a, n, lanes):
    """max(a[:n], NO_SCORE), in 16 lanes (lanes: scratch of 16): numba's max() as a
    loop's reduction does not vectorise (1.1 ns an element against 0.2)."""
    for i in range(16):
        lanes[i] = NO_SCORE
    for i in range(0, n - 15, 16):
        for j in range(16):
            x = a[i + j]
            lanes[j] = x if x > lanes[j] else lanes[j]
    best = NO_SCORE
    for j in range(16):
        best = lanes[j] if lanes[j] > best else best
    for j in range(n - n % 16, n):
        x = a[j]
        best = x if x > best else best
    return best


@njit(fastmath=True, inline="always")
def _masked(key, position, window) -> bool:
    """Whether a token at `position` must not see `key` (after it, or before its window)."""
    return key > position or (window > 0 and key <= position - window)


@njit(fastmath=True, inline="always")
def _accumulate_v(acc_row, weights, vbuf, n_keys):
    """acc_row += sum_j weights[j] * vbuf[j], four keys a pass (acc's row is read and
    written once per four keys, not per key)."""
    for j in range(0, n_keys - 3, 4):
        p0, p1, p2, p3 = weights[j], weights[j + 1], weights[j + 2], weights[j + 3]
        v0, v1, v2, v3 = vbuf[j], vbuf[j + 1], vbuf[j + 2], vbuf[j + 3]
        for d in range(acc_row.shape[0]):
            acc_row[d] += (p0 * v0[d] + p1 * v1[d]) + (p2 * v2[d] + p3 * v3[d])
    for j in range(n_keys - n_keys % 4, n_keys):
        p, v = weights[j], vbuf[j]
        for d in range(acc_row.shape[0]):
            acc_row[d] += p * v[d]


@njit(fastmath=True)
def attend_few(q, k_cache, v_cache, table, positions, t0, n_tok, kvh, k0, k1, scale, window,
               softcap, q_rows, kbuf, block_scores, scores, lanes, top, total, acc):
    """Rows t0 .. t0 + n_tok - 1 x this KV head's group against keys k0 .. k1 - 1 (at most
    scores.shape[1]): scores, then weights, then V. q_rows (rows, D), kbuf (KEYS, D),
    block_scores (FEW_ROWS, 16), scores (FEW_ROWS, keys), lanes (16,) are scratch. (Hot
    loops index views with their loop variables alone: an index numba cannot prove
    non-negative, as at + i, stops LLVM vectorising the loop: 4.2 against 0.8 ns an
    element.)"""
    n_heads, head_dim = q.shape[1], q.shape[2]
    block_size = v_cache.shape[1]
    group = n_heads // v_cache.shape[2]
    rows, n = n_tok * group, k1 - k0
    for r in range(rows):
        q_row = q[t0 + r // group, kvh * group + r % group]
        for d in range(head_dim):
            q_rows[r, d] = q_row[d] * scale
    key = k0
    while key < k1:  # scores: a block's keys at a time, as the pool holds them
        block, offset = table[key // block_size], key % block_size
        n_keys = min(block_size - offset, k1 - key)
        keys = k_cache[block, kvh]  # (D, block_size); int8: (D + D/16, block_size)
        if block_size == LANES and offset == 0 and key + BLOCKS_A_PASS * LANES <= k1:  # 4 whole blocks
            at = key // LANES
            key_scores(q_rows, rows, (keys, k_cache[table[at + 1], kvh], k_cache[table[at + 2], kvh],
                                      k_cache[table[at + 3], kvh]), scores, key - k0)
            n_keys = BLOCKS_A_PASS * LANES
        elif block_size == LANES:  # the whole block's 16 scores of each row, in registers
            key_scores(q_rows, rows, (keys,), block_scores, 0)
            for r in range(rows):
                out, got = scores[r, key - k0:key - k0 + n_keys], block_scores[r, offset:offset + n_keys]
                for j in range(n_keys):
                    out[j] = got[j]
        else:  # a key at a time, widened into L1
            for j in range(n_keys):
                _widen_key(k_cache, block, offset + j, kvh, kbuf[0])
                k_row = kbuf[0]
                for r in range(rows):
                    q_row = q_rows[r]
                    dot = float32(0.0)
                    for d in range(head_dim):
                        dot += q_row[d] * k_row[d]
                    scores[r, key - k0 + j] = dot
        key += n_keys
    for r in range(rows):
        row, position = scores[r, :n], positions[t0 + r // group]
        if softcap > 0:  # Gemma 2
            for i in range(n):
                row[i] = softcap * np.tanh(row[i] / softcap)
        if _masked(k0, position, window) or _masked(k1 - 1, position, window):
            for i in range(n):
                if _masked(k0 + i, position, window):
                    row[i] = NO_SCORE
        best = _max_of(row, n, lanes)
        weight = float32(0.0)
        for i in range(n):
            s = row[i]
            p = exp32(s - best) if s > NO_SCORE else float32(0.0)
            row[i] = p
            weight += p
        top[r], total[r] = best, weight
        acc[r, :] = 0.0
    key = k0
    while key < k1:  # V: a block's keys at a time, into every query row's sum
        block, offset = table[key // block_size], key % block_size
        n_keys = min(KEYS, block_size - offset, k1 - key)
        if head_dim % LANES == 0:  # the rows' sums in registers across the keys
            weigh_keys(scores, key - k0, rows, v_cache[block], kvh, offset, n_keys, acc)
        else:  # rows widened into L1 first
            for j in range(n_keys):
                _widen_row(v_cache, block, offset + j, kvh, kbuf[j])
            for r in range(rows):
                _accumulate_v(acc[r], scores[r, key - k0:key - k0 + n_keys], kbuf, n_keys)
        key += n_keys


@njit(fastmath=True)
def attend_many(q, k_cache, v_cache, table, positions, t0, n_tok, kvh, k0, k1, scale, window,
                softcap, q_t, kbuf, vbuf, scores, best, top, total, acc):
    """Rows t0 .. t0 + n_tok - 1 x this KV head's group against keys k0 .. k1 - 1, KEYS
    keys a pass with a running max. q_t (D, Rp), kbuf and vbuf (KEYS, D), scores
    (KEYS, Rp), best (Rp,) are scratch; Rp: the rows rounded up to 16, the padding's
    q and weights zero (acc: (Rp, D)). Where D is a multiple of 16 the two products
    are attention_ir's register-blocked kernels, else plain loops."""
    n_heads, head_dim = q.shape[1], q.shape[2]
    block_size = v_cache.shape[1]
    group = n_heads // v_cache.shape[2]
    rows, padded = n_tok * group, q_t.shape[1]
    blocked = head_dim % 16 == 0
    q_t[:, :] = 0.0
    acc[:, :] = 0.0
    for r in range(rows):
        top[r], total[r] = NO_SCORE, 0.0
        q_row = q[t0 + r // group, kvh * group + r % group]
        for d in range(head_dim):
            q_t[d, r] = q_row[d] * scale
    first_pos, last_pos = positions[t0], positions[t0 + n_tok - 1]
    key = k0
    while key < k1:
        block, offset = table[key // block_size], key % block_size
        n_keys = min(KEYS, block_size - offset, k1 - key)
        for j in range(n_keys):  # this KV head's rows of the block, in L1, float32
            _widen_key(k_cache, block, offset + j, kvh, kbuf[j])
            _widen_row(v_cache, block, offset + j, kvh, vbuf[j])
        if blocked:  # a key's scores for every row
            score_tile(q_t, kbuf, n_keys, scores)
        else:
            for j in range(n_keys):
                row, k_row = scores[j], kbuf[j]
                row[:] = 0.0
                for d in range(head_dim):
                    kd, q_d = k_row[d], q_t[d]
                    for r in range(rows):
                        row[r] += kd * q_d[r]
        if softcap > 0:  # Gemma 2
            for j in range(n_keys):
                row = scores[j]
                for r in range(rows):
                    row[r] = softcap * np.tanh(row[r] / softcap)
        if key + n_keys - 1 > first_pos or (window > 0 and key <= last_pos - window):
            for j in range(n_keys):
                for r in range(rows):
                    if _masked(key + j, positions[t0 + r // group], window):
                        scores[j, r] = NO_SCORE
        for r in range(rows):
            best[r] = top[r]
        for j in range(n_keys):
            row = scores[j]
            for r in range(rows):
                best[r] = row[r] if row[r] > best[r] else best[r]
        for r in range(rows):
            if best[r] > top[r]:  # a new max: rescale what was summed so far
                shrink = exp32(top[r] - best[r])
                total[r] *= shrink
                acc_row = acc[r]
                for d in range(head_dim):
                    acc_row[d] *= shrink
                top[r] = best[r]
        for j in range(n_keys):
            row = scores[j]
            for r in range(rows):
                s = row[r]
                p = exp32(s - best[r]) if s > NO_SCORE else float32(0.0)
                row[r] = p
                total[r] += p
            for r in range(rows, padded):  # (the padding's weights: none)
                row[r] = 0.0
        if blocked:
            weigh_values(scores, vbuf, n_keys, acc)
        else:
            for r in range(rows):
                _accumulate_v(acc[r], scores[:, r], vbuf, n_keys)
        key += n_keys

"""Sampling kernel: top-k, top-p and min-p over a batch of rows, without sorting the
vocabulary. Spec: kernels/reference.sample_filtered (equal bit for bit).

A full sort of 49k probabilities costs ~4 ms per token; but only the heaviest tokens
can be in the top-k or the nucleus. So each row collects the tokens above a weight
threshold (1e-3 of the most likely one first), sorts those few, and lowers the
threshold only when they do not reach the k-th token or the nucleus's mass. The
draw walks those candidates in id order (every kept token is one of them), or the
whole row where no filter is on.
"""
import threading

import numpy as np
from numba import float32, prange

from ...jit_cache import cached_njit
from ..reference import SEQUENTIAL_TERMS, SUM_LANES
from .address_call import call_entry, run_at_address
from .fast_exp import exp32

_LOWEST_EXP = float32(-87.33)  # (below: 0, where exp32 would stop at e^-87.33)
COLLECT_BLOCK = 32  # weights _collect checks at once

FIRST_THRESHOLD = 1e-3  # weight (relative to the most likely token) of the first candidates
THRESHOLD_STEP = 1e-3  # each retry lowers the threshold by this factor
LOWEST_THRESHOLD = 1e-30  # below this, every token is a candidate


@cached_njit(parallel=True)
def row_weights(logits, rows, temperature, best, out, n_chunks=1):
    """out[j] (V,) float32 = exp(logits[rows[j]] / temperature[j] - best[j]), where
    best[j] is the row's largest logit over its temperature; 0 for a logit of -inf or
    a weight under e^-87.33 (exp32's range). One pass a row, vectorised, on numba's
    threads: the numpy steps it replaces (a copy, a divide, a subtract, exp) took 1.3 ms
    of a 32-row step of SmolLM2's 49,152 logits, on one core."""
    for c in prange(n_chunks):
        for j in range(c, len(rows), n_chunks):
            row, t, b = logits[rows[j]], temperature[j], best[j]
            w = out[j]
            for i in range(row.shape[0]):
                x = row[i] / t - b  # (float32 steps, as numpy's were)
                w[i] = exp32(x) if x > _LOWEST_EXP else float32(0.0)


def sample_rows(weights, top_k, top_p, min_p, u, out, n_chunks=1) -> None:
    """out[r] = the token drawn for row r. weights (R, V) float32: exp(logits / T - max)
    per row; top_k (R,) int64 (0: off); top_p (R,) float64; min_p (R,) float32 (compared
    with float32 weights as the spec does); u (R,) float64. Reads each row
    a few times (3-4 passes of V); sorts only the candidates. Rows are independent:
    n_chunks work items (numba's thread count) each take every n_chunks-th row."""
    args = (n_chunks, weights, weights.view(np.int32), top_k, top_p, min_p, u, out,  # (the bits: _heaviest_first)
            _id_buffers(n_chunks, weights.shape[1]))
    if n_chunks == 1:  # (no parallel loop to start: ~10 us)
        _sample_share(0, *args)
    else:
        run_at_address(_sample_rows, args, _sample_share, _SHARE_ENTRIES, None)


_SHARE_ENTRIES: dict = {}  # _sample_share's entry (address_call.py)
_scratch = threading.local()  # this thread's id buffers


def _id_buffers(n_chunks: int, n_vocab: int) -> np.ndarray:
    """(n_chunks, 2, n_vocab) int64: each work item's candidates and their order, this
    thread's from its last call where large enough (two fresh arrays a call, freed back
    to the system, cost ~20 us of a batch-1 draw's ~100)."""
    kept = getattr(_scratch, "ids", None)
    if kept is None or kept.shape[0] < n_chunks or kept.shape[2] != n_vocab:
        kept = _scratch.ids = np.empty((n_chunks, 2, n_vocab), np.int64)
    return kept


@cached_njit(parallel=True)
def _sample_rows(n_chunks, weights, weight_bits, top_k, top_p, min_p, u, out, ids, share):
    """The work items on numba's threads, each _sample_share called at its address
    `share` (address_call.py: the rows' code is compiled once, not again into the
    parallel loop's libraries). False, with nothing drawn, where share was compiled for
    other types."""
    done = np.empty(n_chunks, np.bool_)
    for c in prange(n_chunks):
        done[c] = call_entry(share, (np.int64(c), n_chunks, weights, weight_bits, top_k, top_p, min_p,
                                     u, out, ids))
    return done.all()


@cached_njit()
def _sample_share(c, n_chunks, weights, weight_bits, top_k, top_p, min_p, u, out, ids):
    """Work item c's rows (every n_chunks-th from c), with ids[c] its buffers."""
    candidates, order = ids[c, 0], ids[c, 1]
    for r in range(c, weights.shape[0], n_chunks):
        out[r] = _sample_row(weights[r], weight_bits[r], top_k[r], top_p[r], min_p[r], u[r], candidates, order)


@cached_njit(fastmath=True)
def _collect(w, threshold, candidates) -> int:
    """Ids of the tokens weighing >= threshold, in id order, into candidates; their count.
    A block of COLLECT_BLOCK weights is read one by one only where its largest reaches
    the threshold (a few dozen blocks of a vocabulary's thousands: the largest of each
    is taken in vector registers)."""
    n, size = 0, w.shape[0]
    full = size - size % COLLECT_BLOCK
    for start in range(0, full, COLLECT_BLOCK):
        largest = w[start]
        for i in range(start + 1, start + COLLECT_BLOCK):
            largest = max(largest, w[i])
        if largest >= threshold:
            for i in range(start, start + COLLECT_BLOCK):
                if w[i] >= threshold:
                    candidates[n] = i
                    n += 1
    for i in range(full, size):
        if w[i] >= threshold:
            candidates[n] = i
            n += 1
    return n


@cached_njit()
def _kth_heaviest(w, w_bits, k, candidates, order) -> float:
    threshold = FIRST_THRESHOLD
    while True:
        if threshold < LOWEST_THRESHOLD:
            threshold = -1.0
        n = _collect(w, threshold, candidates)
        if n >= k:
            _heaviest_first(w_bits, candidates, n, order)
            return w[order[k - 1]]
        threshold *= THRESHOLD_STEP


@cached_njit()
def _heaviest_first(w_bits, ids, n, order) -> None:
    """order[:n] = ids[:n] heaviest first, ties by lower id (the spec's stable order).
    w_bits: the weights' float32 bits as int32 (for weights >= 0, ordered as the
    weights), so one int64 key a token sorts them: its bits, complemented, above its id
    (one sort of plain integers, where np.argsort's mergesort took another ~1 s to
    compile and read the weights through the ids)."""
    for j in range(n):
        order[j] = (np.int64(0x7FFFFFFF - w_bits[ids[j]]) << 32) | ids[j]
    order[:n].sort()
    for j in range(n):
        order[j] &= 0xFFFFFFFF


@cached_njit()
def _sample_row(w, w_bits, top_k, top_p, min_p, u, candidates, order) -> int:
    n_vocab = w.shape[0]
    kth = np.float32(-1.0)  # keep weights >= kth
    n = 0  # where > 0: candidates[:n] (id order) hold every kept token
    if 0 < top_k < n_vocab:
        kth = _kth_heaviest(w, w_bits, top_k, candidates, order)
        n = _collect(w, np.float64(kth), candidates)  # (float64 as its other calls: compiled once)
    # nucleus boundary: keep w > edge_w, or w == edge_w with id <= edge_id
    edge_w, edge_id = np.float32(-1.0), n_vocab
    if top_p < 1.0:
        if n > 0:  # (top-k: the kept are the candidates, in id order)
            total = 0.0
            for j in range(n):
                total += w[candidates[j]]
        else:
            total = _weight_total(w)
        limit = top_p * total
        threshold = FIRST_THRESHOLD
        while True:
            if threshold < LOWEST_THRESHOLD or threshold <= kth:
                threshold = kth  # every kept token is a candidate: the last pass
            n = _collect(w, max(threshold, kth), candidates)
            _heaviest_first(w_bits, candidates, n, order)
            before, found = 0.0, False
            for j in range(n):
                if before >= limit:  # order[j] and everything lighter fall outside
                    edge_w, edge_id = w[order[j - 1]], order[j - 1]
                    found = True
                    break
                before += w[order[j]]
            if found or threshold == kth:
                break  # (not found with every token: the nucleus is all of them)
            threshold *= THRESHOLD_STEP
    # every kept token weighs >= the last threshold collected at, so it is among the
    # candidates, which are in id order: the same sums as over the whole row (n == 0:
    # neither filter, the whole row)
    return _draw(w, candidates, n, kth, edge_w, edge_id, min_p, u)


@cached_njit()
def _weight_total(w) -> float:
    """reference.weight_total: one float64 sum in id order for a short row, else
    SUM_LANES interleaved ones added lane 0 first (independent adds: vectorised)."""
    n_vocab = w.shape[0]
    if n_vocab <= SEQUENTIAL_TERMS:
        total = 0.0
        for i in range(n_vocab):
            total += w[i]
        return total
    lanes = np.zeros(SUM_LANES)
    full = n_vocab - n_vocab % SUM_LANES
    for i in range(0, full, SUM_LANES):
        for lane in range(SUM_LANES):
            lanes[lane] += w[i + lane]
    for i in range(full, n_vocab):
        lanes[i - full] += w[i]
    total = 0.0
    for lane in range(SUM_LANES):
        total += lanes[lane]
    return total


@cached_njit()
def _draw(w, candidates, n, kth, edge_w, edge_id, min_p, u) -> int:
    """The draw over the kept tokens among candidates[:n] (in id order; n == 0: among
    all): the first whose running weight exceeds u times their total (float64 sums in
    id order, as the spec's)."""
    count = n if n > 0 else w.shape[0]
    total = 0.0
    for j in range(count):
        i = candidates[j] if n > 0 else j
        if _kept(w[i], i, kth, edge_w, edge_id, min_p):
            total += w[i]
    target = u * total
    running, last = 0.0, -1
    for j in range(count):
        i = candidates[j] if n > 0 else j
        if _kept(w[i], i, kth, edge_w, edge_id, min_p):
            running += w[i]
            last = i
            if running > target:
                return i
    return last


@cached_njit(inline="always")
def _kept(wi, i, kth, edge_w, edge_id, min_p) -> bool:
    return (wi >= kth and (wi > edge_w or (wi == edge_w and i <= edge_id))
            and (min_p == 0.0 or wi >= min_p))

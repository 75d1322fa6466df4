"""Sampling kernel: top-k, top-p and min-p over a batch of rows, without sorting the
vocabulary. Spec: kernels/reference.sample_filtered (equal bit for bit).

A full sort of 49k probabilities costs ~4 ms per token; but only the heaviest tokens
can be in the top-k or the nucleus. So each row collects the tokens above a weight
threshold (1e-3 of the most likely one first), sorts those few, and lowers the
threshold only when they do not reach the k-th token or the nucleus's mass. The
draw itself is one pass in id order.
"""
import numpy as np
from numba import prange

from ...jit_cache import cached_njit

FIRST_THRESHOLD = 1e-3  # weight (relative to the most likely token) of the first candidates
THRESHOLD_STEP = 1e-3  # each retry lowers the threshold by this factor
LOWEST_THRESHOLD = 1e-30  # below this, every token is a candidate


@cached_njit(parallel=True)
def sample_rows(weights, top_k, top_p, min_p, u, out, n_chunks=1):
    """out[r] = the token drawn for row r. weights (R, V) float32: exp(logits / T - max)
    per row; top_k (R,) int64 (0: off); top_p (R,) float64; min_p (R,) float32 (compared
    with float32 weights as the spec does); u (R,) float64. Reads each row
    a few times (3-4 passes of V); sorts only the candidates. Rows are independent:
    n_chunks work items (numba's thread count) each take every n_chunks-th row, with
    a candidates buffer of their own."""
    for c in prange(n_chunks):
        candidates = np.empty(weights.shape[1], dtype=np.int64)
        for r in range(c, weights.shape[0], n_chunks):
            out[r] = _sample_row(weights[r], top_k[r], top_p[r], min_p[r], u[r], candidates)


@cached_njit()
def _collect(w, threshold, candidates) -> int:
    """Ids of the tokens weighing >= threshold, in id order, into candidates; their count."""
    n = 0
    for i in range(w.shape[0]):
        if w[i] >= threshold:
            candidates[n] = i
            n += 1
    return n


@cached_njit()
def _kth_heaviest(w, k, candidates) -> float:
    threshold = FIRST_THRESHOLD
    while True:
        if threshold < LOWEST_THRESHOLD:
            threshold = -1.0
        n = _collect(w, threshold, candidates)
        if n >= k:
            heaviest = np.sort(w[candidates[:n]])  # ascending
            return heaviest[n - k]
        threshold *= THRESHOLD_STEP


@cached_njit()
def _sample_row(w, top_k, top_p, min_p, u, candidates) -> int:
    n_vocab = w.shape[0]
    kth = np.float32(-1.0)  # keep weights >= kth
    if 0 < top_k < n_vocab:
        kth = _kth_heaviest(w, top_k, candidates)
    # nucleus boundary: keep w > edge_w, or w == edge_w with id <= edge_id
    edge_w, edge_id = np.float32(-1.0), n_vocab
    if top_p < 1.0:
        total = 0.0
        for i in range(n_vocab):
            if w[i] >= kth:
                total += w[i]
        limit = top_p * total
        threshold = FIRST_THRESHOLD
        while True:
            if threshold < LOWEST_THRESHOLD or threshold <= kth:
                threshold = kth  # every kept token is a candidate: the last pass
            n = _collect(w, max(threshold, kth), candidates)
            order = candidates[:n][np.argsort(-w[candidates[:n]], kind="mergesort")]
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
    total = 0.0
    for i in range(n_vocab):
        if _kept(w[i], i, kth, edge_w, edge_id, min_p):
            total += w[i]
    target = u * total
    running, last = 0.0, -1
    for i in range(n_vocab):
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

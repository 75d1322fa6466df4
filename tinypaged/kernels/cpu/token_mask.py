"""Token masks of structured outputs, applied to logits rows. Spec:
kernels/reference.apply_token_mask (equal exactly).

A mask row holds one bit per token (llguidance's layout: token t is bit t % 32 of
int32 word t // 32). A JSON grammar allows a few hundred of 49k tokens at most
steps, so whole words are mostly 0: those are written 32 tokens at a time.
"""
import numpy as np
from numba import prange

from ...jit_cache import cached_njit


@cached_njit(parallel=True)
def mask_rows(rows, which, masks):
    """rows (R, V) float32, in place: in row which[i], every token whose bit is 0 in
    masks[i] (W >= ceil(V / 32) int32 words) becomes -inf. Rows not in which are
    not read (an unconstrained row pays nothing)."""
    n_vocab = rows.shape[1]
    for i in prange(which.shape[0]):
        row, mask = rows[which[i]], masks[i]
        for w in range((n_vocab + 31) // 32):
            word = mask[w]
            if word == -1:  # all 32 allowed
                continue
            end = min(32 * w + 32, n_vocab)
            if word == 0:
                row[32 * w:end] = -np.inf
                continue
            for t in range(32 * w, end):
                if not (word >> (t - 32 * w)) & 1:
                    row[t] = -np.inf

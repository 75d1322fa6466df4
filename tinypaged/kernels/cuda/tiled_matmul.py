"""The tiled CUDA product out (M, N) = x (M, K) @ W (N, K).T (+ bias), float32 sums, for
more rows of x than the decode GEMVs take: decode batches of 9-64 rows and prefill.

A block computes a TILE x TILE tile of out, each of its TILED_THREADS threads a PATCH x
PATCH patch held in registers: rows ty + SIDE i, columns tx + SIDE j (strided, so a
warp reads the shared tiles as broadcasts and consecutive words). K is walked DEPTH at
a time: a slice of x and of W is staged in shared memory, and each value staged there
is used TILE times, PATCH of them from a register. A thread issues the
next slice's global loads into registers before it sums the current one, so their
round trip overlaps its FMAs: one shared buffer, two barriers a slice. W's values come
through `weight(w, n, k, half)`: float16/32 here, packed kinds dequantized on read
(packed_matmul.py, kquant_matmul.py), so a packed matrix is read packed.

Split-K: blockIdx.z sums the slices of K in [z k_span, (z + 1) k_span). A decode batch
has one row of tiles and N / TILE tiles (9 for a 576-wide output): too few
blocks for the SMs, so K is split until they fill them (tiled_split). With splits, each
block writes its partial tile, fences it and counts itself in arrivals[tile]; the last
to arrive adds the splits' partials in split order (the same sums whichever block is
last), adds the bias and sets the count back to zero. Prefill has tiles enough: one split.
"""
import numpy as np
from numba import config, cuda, float32, int32

from .bounded_jit import jit_bounded

# a block's tile of out (TILE x TILE), a thread's patch of it (PATCH x PATCH), the slice of
# K staged at a time: a GPU's (tools/step_model.py prices these) and the simulator's, a
# Python thread per CUDA thread: 16 threads, the same paths
GPU_TILE, GPU_PATCH, GPU_DEPTH = 64, 4, 16
TILE, PATCH, DEPTH = (8, 2, 8) if config.ENABLE_CUDASIM else (GPU_TILE, GPU_PATCH, GPU_DEPTH)
SIDE = TILE // PATCH  # threads along a tile's rows and along its columns
TILED_THREADS = SIDE * SIDE  # 256 on a GPU
LOADS = TILE * DEPTH // TILED_THREADS  # x values, and W values, a thread stages a slice
SHARED_ROW = DEPTH + 1  # words a staged row takes: a warp's 16 columns of W fall in 16 banks
MIN_SPLIT_SLICES = 2  # split-K: the fewest DEPTH-wide slices a split sums
SPLITS_AT_ONCE = 4  # split-K: partials the last block loads at once
# 2 blocks an SM: up to 128 registers a thread (~105 taken: 16 sums, 8 loads in flight,
# their addresses); 3 (80 registers) spills 24-68 bytes a thread, and so does a DEPTH of
# 32 (16 loads in flight) at 128
TILED_BOUNDS = (TILED_THREADS, 2)


def tiled_split(rows: int, cols: int, width: int, sms: int, tile: int = TILE,
                depth: int = DEPTH) -> tuple[int, int]:
    """(splits of K, k_span: the K values a split sums, a multiple of DEPTH) for an
    (rows x width) @ (width x cols) product on `sms` SMs: one split where the tiles fill
    the SMs, else as many as fill them, each of at least MIN_SPLIT_SLICES slices, and
    none empty. (tile, depth: the kernel's; the step model asks for a GPU's.)"""
    tiles = -(-rows // tile) * -(-cols // tile)
    slices = -(-width // depth)
    splits = max(1, min(-(-sms // tiles), slices // MIN_SPLIT_SLICES))
    per_split = -(-slices // splits)
    return -(-slices // per_split), per_split * depth


def launch_tiled(launch, kernel, x, matrix, bias, has_bias, out) -> None:
    """out = x @ W.T (+ bias) through `launch` (the backend's Launcher): kernel is a
    tiled_kernel's product, matrix the arguments its weight reads."""
    rows, width = x.shape
    cols = out.shape[1]
    splits, k_span = tiled_split(rows, cols, width, launch.sms)
    tiles = (-(-cols // TILE), -(-rows // TILE))
    partials = launch.empty(splits, rows, cols) if splits > 1 else launch.empty(1, 1, 1)
    launch(kernel, (*tiles, splits), TILED_THREADS, x, matrix, bias, has_bias, out, partials,
           launch.arrival_counts(tiles[1], tiles[0]), np.int32(k_span))


def tiled_kernel(weight):
    """The tiled product with W's values read through weight(w, n, k, half) (half = K/2,
    where packed nibble rows fold). Grid (ceil(N / TILE), ceil(M / TILE), splits), block
    TILED_THREADS (launch_tiled)."""

    @cuda.jit(device=True, inline="always")
    def load_slice(x, w, row0, col0, k0, k_end, half, n_out, x_next, w_next):
        """This thread's share of the slice at k0: x_next[l], w_next[l] for the slice's
        values t + l TILED_THREADS (row-major [row, k] and [n, k]: a warp reads runs along K).
        Values past M, N or the split's k_end are zeros."""
        t = cuda.threadIdx.x
        for l in range(LOADS):
            e = t + l * TILED_THREADS
            r, k = row0 + e // DEPTH, k0 + e % DEPTH
            x_next[l] = x[r, k] if r < x.shape[0] and k < k_end else float32(0.0)
        for l in range(LOADS):
            e = t + l * TILED_THREADS
            n, k = col0 + e // DEPTH, k0 + e % DEPTH
            w_next[l] = weight(w, n, k, half) if n < n_out and k < k_end else float32(0.0)

    @jit_bounded(TILED_BOUNDS)
    def matmul_tiled(x, w, bias, has_bias, out, partials, arrivals, k_span):
        x_s = cuda.shared.array((TILE, SHARED_ROW), dtype=float32)  # [row, k]
        w_s = cuda.shared.array((TILE, SHARED_ROW), dtype=float32)  # [n, k]
        last_s = cuda.shared.array(1, dtype=int32)  # this block arrived last
        acc = cuda.local.array((PATCH, PATCH), dtype=float32)
        a = cuda.local.array(PATCH, dtype=float32)
        b = cuda.local.array(PATCH, dtype=float32)
        x_next = cuda.local.array(LOADS, dtype=float32)
        w_next = cuda.local.array(LOADS, dtype=float32)
        t = cuda.threadIdx.x
        tx, ty = t % SIDE, t // SIDE
        n_rows, width = x.shape
        n_out = out.shape[1]
        half = width // 2
        row0, col0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
        k_start = cuda.blockIdx.z * k_span
        k_end = min(width, k_start + k_span)
        for i in range(PATCH):
            for j in range(PATCH):
                acc[i, j] = float32(0.0)
        load_slice(x, w, row0, col0, k_start, k_end, half, n_out, x_next, w_next)
        for k0 in range(k_start, k_end, DEPTH):
            for l in range(LOADS):
                e = t + l * TILED_THREADS
                x_s[e // DEPTH, e % DEPTH] = x_next[l]
                w_s[e // DEPTH, e % DEPTH] = w_next[l]
            cuda.syncthreads()  # the slice is staged
            if k0 + DEPTH < k_end:  # the next slice's loads go out before these sums
                load_slice(x, w, row0, col0, k0 + DEPTH, k_end, half, n_out, x_next, w_next)
            for kk in range(DEPTH):
                for i in range(PATCH):
                    a[i] = x_s[ty + SIDE * i, kk]
                for j in range(PATCH):
                    b[j] = w_s[tx + SIDE * j, kk]
                for i in range(PATCH):
                    for j in range(PATCH):
                        acc[i, j] += a[i] * b[j]
            cuda.syncthreads()  # everyone has read the slice before the next is staged

        splits = cuda.gridDim.z
        if splits > 1:
            for i in range(PATCH):
                for j in range(PATCH):
                    r, c = row0 + ty + SIDE * i, col0 + tx + SIDE * j
                    if r < n_rows and c < n_out:
                        partials[cuda.blockIdx.z, r, c] = acc[i, j]
            cuda.threadfence()  # this block's partials are visible before it is counted
            cuda.syncthreads()  # every thread's partials written and fenced
            if t == 0:
                last_s[0] = cuda.atomic.add(arrivals, (cuda.blockIdx.y, cuda.blockIdx.x), 1) == splits - 1
            cuda.syncthreads()  # the count read
            if last_s[0] == 0:
                return
        for i in range(PATCH):
            for j in range(PATCH):
                r, c = row0 + ty + SIDE * i, col0 + tx + SIDE * j
                if r < n_rows and c < n_out:
                    total = acc[i, j]
                    if splits > 1:
                        total = float32(0.0)
                        for s0 in range(0, splits, SPLITS_AT_ONCE):
                            for u in range(SPLITS_AT_ONCE):  # (a constant count: loads in flight)
                                if s0 + u < splits:
                                    total += partials[s0 + u, r, c]
                    out[r, c] = total + bias[c] if has_bias else total
        if splits > 1 and t == 0:
            arrivals[cuda.blockIdx.y, cuda.blockIdx.x] = 0  # (the next launch counts from zero)

    return matmul_tiled


@cuda.jit(device=True, inline="always")
def _plain_weight(w, n, k, half):
    """Weight (n, k) of a float16 / float32 matrix, as float32."""
    return float32(w[n, k])


matmul_tiled = tiled_kernel(_plain_weight)

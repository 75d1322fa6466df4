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

Three kernels share that loop (tiled_kernels): the product; q, k and v as one product
over their rows side by side (a tile may straddle two matrices); and gate/up, each
tile taking HALF rows of gate and the same HALF of up, so that the thread holding
both of an output applies SiLU to them: 4 launches a layer past the GEMVs' rows, as
at batch 1.
"""
import math
from typing import NamedTuple

import numpy as np
from numba import config, cuda, float32, int32

from .bounded_jit import jit_bounded
from .device_function import device_function

# a block's tile of out (TILE x TILE), a thread's patch of it (PATCH x PATCH), the slice of
# K staged at a time: a GPU's (tools/step_model.py prices these) and the simulator's, a
# Python thread per CUDA thread: 16 threads, the same paths
GPU_TILE, GPU_PATCH, GPU_DEPTH = 64, 4, 16
TILE, PATCH, DEPTH = (8, 2, 8) if config.ENABLE_CUDASIM else (GPU_TILE, GPU_PATCH, GPU_DEPTH)
SIDE = TILE // PATCH  # threads along a tile's rows and along its columns
HALF = TILE // 2  # the fused gate/up product: gate rows a tile takes (and as many of up)
TILED_THREADS = SIDE * SIDE  # 256 on a GPU
LOADS = TILE * DEPTH // TILED_THREADS  # x values, and W values, a thread stages a slice
SHARED_ROW = DEPTH + 1  # words a staged row takes: a warp's 16 columns of W fall in 16 banks
MIN_SPLIT_SLICES = 2  # split-K: the fewest DEPTH-wide slices a split sums
SPLITS_AT_ONCE = 4  # split-K: partials the last block loads at once
# 2 blocks an SM: up to 128 registers a thread (90-128 taken: 16 sums, 8 loads in flight,
# their addresses); 3 (80 registers) spills 24-68 bytes a thread, and so does a DEPTH of
# 32 (16 loads in flight) at 128
TILED_BOUNDS = (TILED_THREADS, 2)


class TiledKernels(NamedTuple):
    """A weight kind's tiled kernels (tiled_kernels)."""
    product: object  # (x, w, bias, has_bias, out)
    qkv: object | None  # (x, wq, wk, wv, bq, bk, bv, has_bias, q, k, v)
    gate_up_silu: object | None  # (x, w_gate, w_up, out)


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


def gate_up_columns(intermediate: int, tile: int = TILE) -> int:
    """The columns the fused gate/up product computes: each tile's first half gate
    rows, its second half the same rows of up (so a thread holds both of an output)."""
    return -(-intermediate // (tile // 2)) * tile


def launch_tiled(launch, kernel, x, matrices, n_cols, *args) -> None:
    """A tiled kernel over x's rows and n_cols columns through `launch` (the backend's
    Launcher): kernel(x, *matrices, *args, partials, arrivals, k_span), with K split
    as tiled_split finds."""
    rows, width = x.shape
    splits, k_span = tiled_split(rows, n_cols, width, launch.sms)
    tiles = (-(-n_cols // TILE), -(-rows // TILE))
    partials = launch.empty(splits, rows, n_cols) if splits > 1 else launch.empty(1, 1, 1)
    launch(kernel, (*tiles, splits), TILED_THREADS, x, *matrices, *args, partials,
           launch.arrival_counts(tiles[1], tiles[0]), np.int32(k_span))


@device_function
def _pick_one(n, bound1, bound2):
    """(which matrix, its row, whether the row exists) of column n: the one matrix's row n."""
    return 0, n, True


@device_function
def _pick_qkv(n, bound1, bound2):
    """Column n of q | k | v side by side: bound1 = Nq, bound2 = Nq + Nk."""
    if n < bound1:
        return 0, n, True
    if n < bound2:
        return 1, n - bound1, True
    return 2, n - bound2, True


@device_function
def _pick_gate_up(n, intermediate, unused):
    """Column n of the fused gate/up product (gate_up_columns): a tile's first HALF
    columns are gate rows, its next HALF the same rows of up."""
    v = n % TILE
    row = n // TILE * HALF + v % HALF
    return (0 if v < HALF else 1), row, row < intermediate


def _tile_sums(weight, pick):
    """The main loop of a tiled kernel over up to three matrices (w0, w1, w2: the one
    matrix thrice for a plain product) whose column n reads row `row` of matrix m
    (pick(n, bound1, bound2) -> (m, row, exists)), through weight(w, row, k, half)."""

    @device_function
    def read(w0, w1, w2, m, row, k, half):
        """weight(w_m, row, k, half), a call per matrix (a matrix picked first, or from a
        tuple by a run-time index, went through local memory: 64-640 bytes of stack).
        A plain product's m is the constant 0: the other branches compile away."""
        if m == 0:
            return weight(w0, row, k, half)
        return weight(w1, row, k, half) if m == 1 else weight(w2, row, k, half)

    @device_function
    def load_slice(x, w0, w1, w2, bound1, bound2, n_cols, row0, col0, k0, k_end, half, x_next, w_next):
        """This thread's share of the slice at k0: x_next[l], w_next[l] for the slice's
        values t + l TILED_THREADS (row-major [row, k] and [n, k]: a warp reads runs
        along K). Values past M, the columns or the split's k_end are zeros."""
        t = cuda.threadIdx.x
        for l in range(LOADS):
            e = t + l * TILED_THREADS
            r, k = row0 + e // DEPTH, k0 + e % DEPTH
            x_next[l] = x[r, k] if r < x.shape[0] and k < k_end else float32(0.0)
        for l in range(LOADS):
            e = t + l * TILED_THREADS
            n, k = col0 + e // DEPTH, k0 + e % DEPTH
            w_next[l] = float32(0.0)
            if n < n_cols and k < k_end:
                m, row, exists = pick(n, bound1, bound2)
                if exists:
                    w_next[l] = read(w0, w1, w2, m, row, k, half)

    @device_function
    def tile_sums(x, w0, w1, w2, bound1, bound2, n_cols, k_span, acc, x_s, w_s):
        """acc[i, j] = the sum over this block's split of K of x[row] . W[column], for
        the thread's rows row0 + ty + SIDE i and columns col0 + tx + SIDE j."""
        a = cuda.local.array(PATCH, dtype=float32)
        b = cuda.local.array(PATCH, dtype=float32)
        x_next = cuda.local.array(LOADS, dtype=float32)
        w_next = cuda.local.array(LOADS, dtype=float32)
        t = cuda.threadIdx.x
        tx, ty = t % SIDE, t // SIDE
        width = x.shape[1]
        half = width // 2
        row0, col0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
        k_start = cuda.blockIdx.z * k_span
        k_end = min(width, k_start + k_span)
        for i in range(PATCH):
            for j in range(PATCH):
                acc[i, j] = float32(0.0)
        load_slice(x, w0, w1, w2, bound1, bound2, n_cols, row0, col0, k_start, k_end, half, x_next, w_next)
        for k0 in range(k_start, k_end, DEPTH):
            for l in range(LOADS):
                e = t + l * TILED_THREADS
                x_s[e // DEPTH, e % DEPTH] = x_next[l]
                w_s[e // DEPTH, e % DEPTH] = w_next[l]
            cuda.syncthreads()  # the slice is staged
            if k0 + DEPTH < k_end:  # the next slice's loads go out before these sums
                load_slice(x, w0, w1, w2, bound1, bound2, n_cols, row0, col0, k0 + DEPTH, k_end, half,
                           x_next, w_next)
            for kk in range(DEPTH):
                for i in range(PATCH):
                    a[i] = x_s[ty + SIDE * i, kk]
                for j in range(PATCH):
                    b[j] = w_s[tx + SIDE * j, kk]
                for i in range(PATCH):
                    for j in range(PATCH):
                        acc[i, j] += a[i] * b[j]
            cuda.syncthreads()  # everyone has read the slice before the next is staged
    return tile_sums


@device_function
def _merge_splits(acc, n_rows, n_cols, partials, arrivals, last_s):
    """With K split (gridDim.z > 1): write this block's partial sums, fence, count
    the block; the last to arrive replaces acc with the splits' sums in split order
    and resets the count. Returns whether this block writes the outputs."""
    splits = cuda.gridDim.z
    if splits == 1:
        return True
    t = cuda.threadIdx.x
    tx, ty = t % SIDE, t // SIDE
    row0, col0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    for i in range(PATCH):
        for j in range(PATCH):
            r, c = row0 + ty + SIDE * i, col0 + tx + SIDE * j
            if r < n_rows and c < n_cols:
                partials[cuda.blockIdx.z, r, c] = acc[i, j]
    cuda.threadfence()  # this block's partials are visible before it is counted
    cuda.syncthreads()  # every thread's partials written and fenced
    if t == 0:
        last_s[0] = cuda.atomic.add(arrivals, (cuda.blockIdx.y, cuda.blockIdx.x), 1) == splits - 1
    cuda.syncthreads()  # the count read
    if last_s[0] == 0:
        return False
    for i in range(PATCH):
        for j in range(PATCH):
            r, c = row0 + ty + SIDE * i, col0 + tx + SIDE * j
            total = float32(0.0)
            if r < n_rows and c < n_cols:
                for s0 in range(0, splits, SPLITS_AT_ONCE):
                    for u in range(SPLITS_AT_ONCE):  # (a constant count: loads in flight)
                        if s0 + u < splits:
                            total += partials[s0 + u, r, c]
            acc[i, j] = total
    if t == 0:
        arrivals[cuda.blockIdx.y, cuda.blockIdx.x] = 0  # (the next launch counts from zero)
    return True


def tiled_kernels(weight, fuse_qkv=True, fuse_gate_up=True) -> TiledKernels:
    """The tiled kernels with W's values read through weight(w, n, k, half) (half = K/2,
    where packed nibble rows fold): launched by launch_tiled, grid (column tiles, row
    tiles, splits), block TILED_THREADS. A kind whose fused kernel ptxas cannot keep
    in registers (three or two inlined reads of a wide kind) has None there: its
    products then go one by one."""
    one, qkv, gate_up = (_tile_sums(weight, pick) for pick in (_pick_one, _pick_qkv, _pick_gate_up))

    @jit_bounded(TILED_BOUNDS)
    def matmul_tiled(x, w, bias, has_bias, out, partials, arrivals, k_span):
        """out = x @ W.T (+ bias)."""
        x_s = cuda.shared.array((TILE, SHARED_ROW), dtype=float32)  # [row, k]
        w_s = cuda.shared.array((TILE, SHARED_ROW), dtype=float32)  # [n, k]
        last_s = cuda.shared.array(1, dtype=int32)  # this block arrived last
        acc = cuda.local.array((PATCH, PATCH), dtype=float32)
        n_rows, n_out = out.shape
        one(x, w, w, w, 0, 0, n_out, k_span, acc, x_s, w_s)
        if not _merge_splits(acc, n_rows, n_out, partials, arrivals, last_s):
            return
        tx, ty = cuda.threadIdx.x % SIDE, cuda.threadIdx.x // SIDE
        for i in range(PATCH):
            for j in range(PATCH):
                r, c = cuda.blockIdx.y * TILE + ty + SIDE * i, cuda.blockIdx.x * TILE + tx + SIDE * j
                if r < n_rows and c < n_out:
                    out[r, c] = acc[i, j] + bias[c] if has_bias else acc[i, j]

    @jit_bounded(TILED_BOUNDS)
    def matmul_tiled_qkv(x, wq, wk, wv, bq, bk, bv, has_bias, q_out, k_out, v_out, partials,
                         arrivals, k_span):
        """q, k, v = x @ (Wq, Wk, Wv).T (+ biases) as one product over their rows side by side."""
        x_s = cuda.shared.array((TILE, SHARED_ROW), dtype=float32)
        w_s = cuda.shared.array((TILE, SHARED_ROW), dtype=float32)
        last_s = cuda.shared.array(1, dtype=int32)
        acc = cuda.local.array((PATCH, PATCH), dtype=float32)
        n_rows, nq, nk = x.shape[0], q_out.shape[1], k_out.shape[1]
        n_cols = nq + 2 * nk
        qkv(x, wq, wk, wv, nq, nq + nk, n_cols, k_span, acc, x_s, w_s)
        if not _merge_splits(acc, n_rows, n_cols, partials, arrivals, last_s):
            return
        tx, ty = cuda.threadIdx.x % SIDE, cuda.threadIdx.x // SIDE
        for i in range(PATCH):
            for j in range(PATCH):
                r, c = cuda.blockIdx.y * TILE + ty + SIDE * i, cuda.blockIdx.x * TILE + tx + SIDE * j
                if r < n_rows and c < n_cols:  # (each output by name: arrays picked at
                    value = acc[i, j]  # run time would go through local memory)
                    if c < nq:
                        q_out[r, c] = value + bq[c] if has_bias else value
                    elif c < nq + nk:
                        k_out[r, c - nq] = value + bk[c - nq] if has_bias else value
                    else:
                        v_out[r, c - nq - nk] = value + bv[c - nq - nk] if has_bias else value

    @jit_bounded(TILED_BOUNDS)
    def matmul_tiled_gate_up_silu(x, w_gate, w_up, out, partials, arrivals, k_span):
        """out = silu(x @ Wg.T) * (x @ Wu.T): a thread's columns j < PATCH / 2 are gate
        rows, j + PATCH / 2 the same rows of up (gate_up_columns)."""
        x_s = cuda.shared.array((TILE, SHARED_ROW), dtype=float32)
        w_s = cuda.shared.array((TILE, SHARED_ROW), dtype=float32)
        last_s = cuda.shared.array(1, dtype=int32)
        acc = cuda.local.array((PATCH, PATCH), dtype=float32)
        n_rows, intermediate = out.shape
        n_cols = (intermediate + HALF - 1) // HALF * TILE
        gate_up(x, w_gate, w_up, w_up, intermediate, 0, n_cols, k_span, acc, x_s, w_s)
        if not _merge_splits(acc, n_rows, n_cols, partials, arrivals, last_s):
            return
        tx, ty = cuda.threadIdx.x % SIDE, cuda.threadIdx.x // SIDE
        for i in range(PATCH):
            for j in range(PATCH // 2):
                r, n = cuda.blockIdx.y * TILE + ty + SIDE * i, cuda.blockIdx.x * HALF + tx + SIDE * j
                if r < n_rows and n < intermediate:
                    g = acc[i, j]
                    out[r, n] = g / (float32(1.0) + math.exp(-g)) * acc[i, j + PATCH // 2]

    return TiledKernels(matmul_tiled, matmul_tiled_qkv if fuse_qkv else None,
                        matmul_tiled_gate_up_silu if fuse_gate_up else None)


@device_function
def _plain_weight(w, n, k, half):
    """Weight (n, k) of a float16 / float32 matrix, as float32."""
    return float32(w[n, k])


FLOAT_TILED = tiled_kernels(_plain_weight)

"""CUDA matrix products out (M, N) = x (M, K) @ W (N, K).T (+ bias), float32 accumulation.

W is float16 (half the bytes; the default on the device) or float32. Two shapes:
- `matmul_tiled`: prefill and large batches. Each 16x16 block stages a 16x16 tile
  of x and of W in shared memory per step along K, so every element loaded from
  global memory is used 16 times. Traffic: x read N/16 times, W read M/16 times.
- `gemv_rows`: decode (M <= GEMV_MAX_ROWS). Each thread streams one weight row once
  and dots it with every row of x: no shared memory, no synchronisation. Traffic:
  W once, x from cache. `gemv_qkv` and `gemv_gate_up_silu` run the same loop over
  two or three matrices, to save launches at decode (~10 us each from Python).
  (A warp per row, reduced with shuffles, coalesces W better; the CUDA simulator
  that CI runs has no shuffles and its barriers cost milliseconds, so that version
  waits for a GPU session to show it pays.)
"""
import math

from numba import cuda, float32

TILE = 16  # matmul_tiled: block (TILE, TILE), shared tiles TILE x TILE
GEMV_MAX_ROWS = 8  # rows of x the decode path takes; beyond this, matmul_tiled
GEMV_THREADS = 128  # gemv kernels: threads (= weight rows) per block


@cuda.jit
def matmul_tiled(x, w, bias, has_bias, out):
    """Grid (ceil(N / TILE), ceil(M / TILE)), block (TILE, TILE): thread (tx, ty)
    computes out[by * TILE + ty, bx * TILE + tx]."""
    x_tile = cuda.shared.array((TILE, TILE), dtype=float32)  # [row, k]
    w_tile = cuda.shared.array((TILE, TILE), dtype=float32)  # [k, n]: read along n, no bank conflicts
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    n_rows, width = x.shape
    n_out = w.shape[0]
    row = cuda.blockIdx.y * TILE + ty
    col = cuda.blockIdx.x * TILE + tx
    w_row = cuda.blockIdx.x * TILE + ty  # the W row this thread loads
    acc = float32(0.0)
    for k0 in range(0, width, TILE):
        k = k0 + tx
        x_tile[ty, tx] = x[row, k] if row < n_rows and k < width else float32(0.0)
        w_tile[tx, ty] = float32(w[w_row, k]) if w_row < n_out and k < width else float32(0.0)
        cuda.syncthreads()  # both tiles are loaded
        for kk in range(TILE):
            acc += x_tile[ty, kk] * w_tile[kk, tx]
        cuda.syncthreads()  # everyone is done reading before the next load
    if row < n_rows and col < n_out:
        if has_bias:
            acc += bias[col]
        out[row, col] = acc


@cuda.jit(device=True, inline="always")
def _row_dots(x, w, n, acc):
    """acc[m] = x[m] . W[n] for every row m of x (float32 accumulation). Every loop over
    acc has the constant length GEMV_MAX_ROWS (rows past M guarded), so the compiler
    keeps acc in registers; a loop to M indexed it at run time, in local memory."""
    n_rows, width = x.shape
    for m in range(GEMV_MAX_ROWS):
        acc[m] = float32(0.0)
    for k in range(width):
        wk = float32(w[n, k])
        for m in range(GEMV_MAX_ROWS):
            if m < n_rows:
                acc[m] += wk * x[m, k]


@cuda.jit
def gemv_rows(x, w, bias, has_bias, out):
    """1-D grid, GEMV_THREADS per block: thread n owns W row n and dots it with every
    row of x. The x row is the same for a whole warp at each step (a broadcast); each
    thread walks its own W row, whose 32-byte sectors stay in L1 between steps."""
    n = cuda.grid(1)
    if n < w.shape[0]:
        acc = cuda.local.array(GEMV_MAX_ROWS, dtype=float32)
        _row_dots(x, w, n, acc)
        for m in range(GEMV_MAX_ROWS):
            if m < x.shape[0]:
                out[m, n] = acc[m] + bias[n] if has_bias else acc[m]


@cuda.jit
def gemv_qkv(x, wq, wk, wv, bq, bk, bv, has_bias, q_out, k_out, v_out):
    """The q, k and v projections in one launch: 1-D grid over Nq + 2 Nk threads;
    thread g owns row g of Wq, then of Wk, then of Wv (layout as gemv_rows)."""
    g = cuda.grid(1)
    nq, nk = wq.shape[0], wk.shape[0]
    if g >= nq + 2 * nk:
        return
    if g < nq:
        w, b, out, n = wq, bq, q_out, g
    elif g < nq + nk:
        w, b, out, n = wk, bk, k_out, g - nq
    else:
        w, b, out, n = wv, bv, v_out, g - nq - nk
    acc = cuda.local.array(GEMV_MAX_ROWS, dtype=float32)
    _row_dots(x, w, n, acc)
    for m in range(GEMV_MAX_ROWS):
        if m < x.shape[0]:
            out[m, n] = acc[m] + b[n] if has_bias else acc[m]


@cuda.jit
def gemv_gate_up_silu(x, w_gate, w_up, out):
    """The MLP's middle in one launch: out = silu(x @ Wg.T) * (x @ Wu.T). 1-D grid over
    I threads; thread n owns row n of both matrices (layout as gemv_rows)."""
    n = cuda.grid(1)
    if n < w_gate.shape[0]:
        gate = cuda.local.array(GEMV_MAX_ROWS, dtype=float32)
        up = cuda.local.array(GEMV_MAX_ROWS, dtype=float32)
        _row_dots(x, w_gate, n, gate)
        _row_dots(x, w_up, n, up)
        for m in range(GEMV_MAX_ROWS):
            if m < x.shape[0]:
                g = gate[m]
                out[m, n] = g / (float32(1.0) + math.exp(-g)) * up[m]

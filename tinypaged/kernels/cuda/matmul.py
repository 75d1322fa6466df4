"""CUDA decode products out (M, N) = x (M, K) @ W (N, K).T (+ bias), float32 accumulation,
for M <= GEMV_MAX_ROWS (more rows: tiled_matmul.py).

W is float16 (half the bytes; the default on the device) or float32.
- `gemv_rows`: decode (M <= GEMV_MAX_ROWS). A warp per weight row: its lanes read
  consecutive VEC-weight chunks of the row (coalesced), dot them with every row of
  x, and sum across the warp with shfl_xor_sync. Traffic: W once, x from cache.
  `gemv_qkv` and `gemv_gate_up_silu` run the same loop over two or three matrices,
  to save launches at decode (~10 us each from Python). On the CUDA simulator the
  shuffles come from tests/warp_shim.py.
"""
import math

from numba import config, cuda, float32

from .bounded_jit import jit_bounded
from .warp import WARP, warp_sum

GEMV_MAX_ROWS = 8  # rows of x the decode path takes; beyond this, tiled_matmul.py
GEMV_WARPS = 4  # gemv kernels: warps (one weight row each at a time) per block
GEMV_THREADS = GEMV_WARPS * WARP
VEC = 4  # consecutive weights a lane reads per step (8 bytes of float16)
SIMULATOR_GEMV_BLOCKS = 2  # gemv_blocks on the simulator
GEMV_BOUNDS = (GEMV_THREADS, 8)  # 8 blocks of 128 threads an SM (50%): at most 64 registers
# float GEMVs: warps that split one weight row (the simulator, a Python thread per CUDA
# thread and Python shuffles, takes one: the GPU tests and the PTX hold the cross-warp sum)
FLOAT_ROW_WARPS = 1 if config.ENABLE_CUDASIM else GEMV_WARPS
FLOAT_ROW_THREADS = FLOAT_ROW_WARPS * WARP


@cuda.jit(device=True, inline="always")
def _warp_sum_rows(acc, n_rows):
    """acc[m] summed over the warp's lanes, every lane getting it, for m < n_rows (the
    same in every lane: the warp shuffles together): butterflies of shfl_xor_sync."""
    for m in range(GEMV_MAX_ROWS):
        if m < n_rows:
            acc[m] = warp_sum(acc[m])


@cuda.jit(device=True, inline="always")
def _first_warp_and_stride():
    """(this warp's index in the grid, warps in the grid): the GEMVs' row loops are
    grid-stride and warp-uniform (every lane of a warp takes the same rows)."""
    return (cuda.blockIdx.x * GEMV_WARPS + cuda.threadIdx.x // WARP,
            cuda.gridDim.x * GEMV_WARPS)


@cuda.jit(device=True, inline="always")
def _store_rows(out, bias, has_bias, n, acc, lane, n_rows):
    """Lane 0 writes out[m, n] = acc[m] (+ bias[n]) for the rows of x."""
    if lane == 0:
        for m in range(GEMV_MAX_ROWS):
            if m < n_rows:
                out[m, n] = acc[m] + bias[n] if has_bias else acc[m]


@cuda.jit(device=True, inline="always")
def _block_row_dots(x, w, w2, n, acc, acc2, sums):
    """acc[m] (in every thread) = x[m] . W[n] for the rows m of x, and acc2[m] = x[m] .
    W2[n] when w2 is given (gate and up: both rows' loads in one pass), the block's
    FLOAT_ROW_WARPS warps splitting the row: thread t takes the VEC consecutive weights at
    32 VEC FLOAT_ROW_WARPS i + VEC t, so each warp reads 256 coalesced bytes a step and a
    576-wide row is two steps of a thread instead of five of a warp (fewer loads
    waiting on each other: the float GEMVs are bound by that latency at batch 1,
    not by bandwidth). Each warp's partial sums meet in a shfl_xor butterfly, then
    the warps' in shared memory (sums: (2, FLOAT_ROW_WARPS, GEMV_MAX_ROWS)), in order.
    For one matrix, w2 is None and acc2 is acc (numba compiles the second one out)."""
    n_rows, width = x.shape
    t = cuda.threadIdx.x
    lane, warp = t % WARP, t // WARP
    two = w2 is not None
    for m in range(GEMV_MAX_ROWS):
        acc[m] = float32(0.0)
        acc2[m] = float32(0.0)
    for k0 in range(t * VEC, width, FLOAT_ROW_THREADS * VEC):
        for v in range(VEC):
            k = k0 + v
            if k < width:
                wk = float32(w[n, k])
                wk2 = float32(w2[n, k]) if two else float32(0.0)
                for m in range(GEMV_MAX_ROWS):
                    if m < n_rows:
                        xk = x[m, k]
                        acc[m] += wk * xk
                        if two:
                            acc2[m] += wk2 * xk
    _warp_sum_rows(acc, n_rows)
    if two:
        _warp_sum_rows(acc2, n_rows)
    if FLOAT_ROW_WARPS == 1:  # (the simulator's: no other warp to add)
        return
    if lane == 0:
        for m in range(GEMV_MAX_ROWS):
            if m < n_rows:
                sums[0, warp, m] = acc[m]
                sums[1, warp, m] = acc2[m]
    cuda.syncthreads()  # every warp's partial sums written
    for m in range(GEMV_MAX_ROWS):
        if m < n_rows:
            total, total2 = sums[0, 0, m], sums[1, 0, m]
            for g in range(1, FLOAT_ROW_WARPS):
                total += sums[0, g, m]
                total2 += sums[1, g, m]
            acc[m], acc2[m] = total, total2
    cuda.syncthreads()  # read by all before the next row writes sums


@jit_bounded(GEMV_BOUNDS)
def gemv_rows(x, w, bias, has_bias, out):
    """A block per W row (grid-stride over rows: block b owns rows b, b + blocks, ...;
    _block_row_dots); thread 0 writes its outputs. Traffic: W once, coalesced; x
    (M x K floats) from L1/L2 once per row."""
    sums = cuda.shared.array((2, FLOAT_ROW_WARPS, GEMV_MAX_ROWS), dtype=float32)
    acc = cuda.local.array(GEMV_MAX_ROWS, dtype=float32)
    for n in range(cuda.blockIdx.x, w.shape[0], cuda.gridDim.x):
        _block_row_dots(x, w, None, n, acc, acc, sums)
        _store_rows(out, bias, has_bias, n, acc, cuda.threadIdx.x, x.shape[0])


@jit_bounded(GEMV_BOUNDS)
def gemv_qkv(x, wq, wk, wv, bq, bk, bv, has_bias, q_out, k_out, v_out):
    """The q, k and v projections in one launch: blocks stride over Nq + 2 Nk rows;
    row g is row g of Wq, then of Wk, then of Wv (layout as gemv_rows)."""
    sums = cuda.shared.array((2, FLOAT_ROW_WARPS, GEMV_MAX_ROWS), dtype=float32)
    nq, nk = wq.shape[0], wk.shape[0]
    acc = cuda.local.array(GEMV_MAX_ROWS, dtype=float32)
    for g in range(cuda.blockIdx.x, nq + 2 * nk, cuda.gridDim.x):
        if g < nq:
            w, b, out, n = wq, bq, q_out, g
        elif g < nq + nk:
            w, b, out, n = wk, bk, k_out, g - nq
        else:
            w, b, out, n = wv, bv, v_out, g - nq - nk
        _block_row_dots(x, w, None, n, acc, acc, sums)
        _store_rows(out, b, has_bias, n, acc, cuda.threadIdx.x, x.shape[0])


@jit_bounded(GEMV_BOUNDS)
def gemv_gate_up_silu(x, w_gate, w_up, out):
    """The MLP's middle in one launch: out = silu(x @ Wg.T) * (x @ Wu.T); blocks stride
    over the I rows, each taking row n of both matrices (layout as gemv_rows)."""
    sums = cuda.shared.array((2, FLOAT_ROW_WARPS, GEMV_MAX_ROWS), dtype=float32)
    gate = cuda.local.array(GEMV_MAX_ROWS, dtype=float32)
    up = cuda.local.array(GEMV_MAX_ROWS, dtype=float32)
    for n in range(cuda.blockIdx.x, w_gate.shape[0], cuda.gridDim.x):
        _block_row_dots(x, w_gate, w_up, n, gate, up, sums)
        if cuda.threadIdx.x == 0:
            for m in range(GEMV_MAX_ROWS):
                if m < x.shape[0]:
                    g = gate[m]
                    out[m, n] = g / (float32(1.0) + math.exp(-g)) * up[m]


def float_gemv_blocks(rows: int) -> int:
    """Blocks for a float GEMV over `rows` weight rows: a block per row (two on the
    simulator, as gemv_blocks)."""
    return min(SIMULATOR_GEMV_BLOCKS, rows) if config.ENABLE_CUDASIM else rows


def gemv_blocks(rows: int) -> int:
    """Blocks for a GEMV over `rows` weight rows: a warp per row. The row loops are
    grid-stride, so fewer blocks give the same rows to fewer warps: on the simulator,
    which runs a Python thread per CUDA thread, two blocks (the CUDA tests ran a
    third faster; the grid-stride loops are what they then exercise)."""
    blocks = -(-rows // GEMV_WARPS)
    return min(SIMULATOR_GEMV_BLOCKS, blocks) if config.ENABLE_CUDASIM else blocks

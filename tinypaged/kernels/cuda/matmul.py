"""CUDA decode products out (M, N) = x (M, K) @ W (N, K).T (+ bias), float32 accumulation,
for M <= GEMV_MAX_ROWS (more rows: tiled_matmul.py).

W is float16 (half the bytes; the default on the device) or float32.
- `gemv_rows`: decode (M <= GEMV_MAX_ROWS). A block per weight row: its lanes read
  consecutive VEC-weight chunks of the row (coalesced), dot them with every row of
  x, and sum across the warps with shfl_xor_sync and shared memory. Traffic: W once,
  x from cache. `gemv_qkv` and `gemv_gate_up_silu` run the same loop over two or
  three matrices, to save launches at decode (~10 us each from Python).
  `gemv_paired_rows`: gemv_rows over a matrix of more rows than a wave of blocks
  (pairs_rows: lm_head), a block per two rows. `gemv_one_row`, `gemv_one_row_paired`:
  the two for one row of x (batch 1), each step's weights and x loaded before any is
  summed (one round trip a step; the 8-row loop waits on each weight in turn).
- NORMED_GEMVS: the first three with the RMSNorm before them folded in (up to
  NORMED_MAX_ROWS rows; normed_rows.py says when).
On the CUDA simulator the shuffles come from tests/warp_shim.py.
"""
import math

from numba import config, cuda, float32

from .bounded_jit import jit_bounded
from .device_function import device_function
from .warp import WARP, warp_sum

GEMV_MAX_ROWS = 8  # rows of x the decode path takes; beyond this, tiled_matmul.py
NORMED_MAX_ROWS = 4  # rows of x the GEMVs with a norm folded in take (NORMED_GEMVS)
GEMV_WARPS = 4  # gemv kernels: warps a block (a block a weight row at a time)
GEMV_THREADS = GEMV_WARPS * WARP
VEC = 4  # consecutive weights a lane of a packed GEMV reads per step
# the float GEMVs': 16 bytes of float16, so a row of up to 1,024 is one step of each
# thread (each step waits on its loads: a 576-wide row took two at 4)
FLOAT_VEC = 8
SIMULATOR_GEMV_BLOCKS = 2  # gemv_blocks on the simulator
GEMV_BOUNDS = (GEMV_THREADS, 8)  # 8 blocks of 128 threads an SM (50%): at most 64 registers
# a float GEMV over more rows (lm_head) takes them in pairs: an H100 / H200's 132 SMs hold
# 1,056 of its blocks at once, and a wave costs a round trip whatever its rows
PAIRED_FROM_ROWS = 1024
# GEMVs: warps that split one weight row (the simulator, a Python thread per CUDA thread
# and Python shuffles, takes one: the GPU tests and the PTX hold the cross-warp sum)
GEMV_ROW_WARPS = 1 if config.ENABLE_CUDASIM else GEMV_WARPS
GEMV_ROW_THREADS = GEMV_ROW_WARPS * WARP


@device_function
def _warp_sum_rows(acc, n_rows):
    """acc[m] summed over the warp's lanes, every lane getting it, for m < n_rows (the
    same in every lane: the warp shuffles together): butterflies of shfl_xor_sync."""
    for m in range(len(acc)):
        if m < n_rows:
            acc[m] = warp_sum(acc[m])


@device_function
def block_sum_rows(acc, n_rows, sums):
    """acc[m] summed over the block's threads, every thread getting it, for m < n_rows:
    each warp's by a shfl_xor butterfly, then the GEMV_ROW_WARPS warps' in order from shared
    memory (sums: (GEMV_ROW_WARPS, len(acc)) float32)."""
    _warp_sum_rows(acc, n_rows)
    if GEMV_ROW_WARPS > 1:  # (the simulator's one warp has no other to add)
        t = cuda.threadIdx.x
        if t % WARP == 0:
            for m in range(len(acc)):
                if m < n_rows:
                    sums[t // WARP, m] = acc[m]
        cuda.syncthreads()  # every warp's partial sums written
        for m in range(len(acc)):
            if m < n_rows:
                total = sums[0, m]
                for g in range(1, GEMV_ROW_WARPS):
                    total += sums[g, m]
                acc[m] = total
        cuda.syncthreads()  # read by all before the next row writes sums


@device_function
def _store_rows(out, bias, has_bias, n, acc, lane, n_rows):
    """Lane 0 writes out[m, n] = acc[m] (+ bias[n]) for the rows of x."""
    if lane == 0:
        for m in range(len(acc)):
            if m < n_rows:
                out[m, n] = acc[m] + bias[n] if has_bias else acc[m]


@device_function
def _one_row_dots(x, w, w2, n, n2, acc, acc2):
    """acc[0] = thread t's share of x[0] . W[n] (acc2[0]: of W2[n2] unless w2 is None), each step's
    FLOAT_VEC weights and x values loaded before any is summed, so a step is one round
    trip (row_dots' loop over up to 8 rows waits on each weight in turn: hoisted, its
    loads spill at 64 registers). A step past the row's end reads the row's last
    FLOAT_VEC instead, the values before k0 (another thread's) zeroed: consecutive
    loads, no branch. Needs K >= FLOAT_VEC."""
    width = x.shape[1]
    two = w2 is not None  # (a None argument: numba compiles the second matrix out)
    weights = cuda.local.array(FLOAT_VEC, float32)  # (registers: the loops unroll)
    weights2 = cuda.local.array(FLOAT_VEC, float32)
    xs = cuda.local.array(FLOAT_VEC, float32)
    for k0 in range(cuda.threadIdx.x * FLOAT_VEC, width, GEMV_ROW_THREADS * FLOAT_VEC):
        base = min(k0, width - FLOAT_VEC)
        for v in range(FLOAT_VEC):
            weights[v] = float32(w[n, base + v])
            weights2[v] = float32(w2[n2, base + v]) if two else float32(0.0)
            xs[v] = x[0, base + v] * (float32(1.0) if base + v >= k0 else float32(0.0))  # (a select)
        for v in range(FLOAT_VEC):
            acc[0] += weights[v] * xs[v]
            if two:
                acc2[0] += weights2[v] * xs[v]


def _float_gemvs(normed: bool, one_row: bool = False):
    """The float GEMV kernels (gemv_rows, gemv_qkv, gemv_gate_up_silu). normed: each
    takes the RMSNorm before it folded in, as a last argument `norm` (residual, gain,
    residual_out, eps, has_residual): x + residual (or x alone) is the
    stream h; the dots are taken with h * gain and scaled by rsqrt(mean(h^2) + eps)
    at the end (dot(w, h s g) = s dot(w, h g): s needs the whole row, the dots do
    not), the squares summed beside the dots, so the norm costs no launch of its own
    and no round trip; with a residual, the block of the first weight row also writes
    h to residual_out (the stream's new sum: normed_rows.py). The normed ones take up
    to NORMED_MAX_ROWS rows of x (more sums spill at 64 registers). one_row: gemv_rows
    and gemv_paired_rows for one row of x, their steps' loads hoisted (_one_row_dots)."""
    assert not (normed and one_row)  # (hoisted, a normed step's loads spilled)
    max_rows = 1 if one_row else NORMED_MAX_ROWS if normed else GEMV_MAX_ROWS

    @device_function
    def row_dots(x, w, w2, n, n2, first, acc, acc2, squares, sums, norm):
        """acc[m] (in every thread) = x[m] . W[n] for the rows m of x, and acc2[m] = x[m] .
        W2[n2] when w2 is given (gate and up: both rows' loads in one pass), the block's
        GEMV_ROW_WARPS warps splitting the row: thread t takes the FLOAT_VEC consecutive
        weights at 32 FLOAT_VEC GEMV_ROW_WARPS i + FLOAT_VEC t, so each warp reads 512
        coalesced bytes a step and a 576-wide row is one step of a thread instead of
        five of a warp (fewer loads waiting on each other: the float GEMVs are bound by
        that latency at batch 1, not by bandwidth). Each warp's partial sums meet in a shfl_xor butterfly, then the
        warps' in shared memory (sums: (3, GEMV_ROW_WARPS, max_rows)), in order.
        For one matrix, w2 is None and acc2 is acc (numba compiles the second one out).
        first: row n is the product's first (normed: its block writes the sum)."""
        n_rows, width = x.shape
        t = cuda.threadIdx.x
        lane, warp = t % WARP, t // WARP
        two = w2 is not None
        for m in range(max_rows):
            acc[m] = float32(0.0)
            acc2[m] = float32(0.0)
            squares[m] = float32(0.0)
        if normed:
            residual, gain, residual_out, eps, has_residual = norm
            writes = has_residual and first
        if one_row and width >= FLOAT_VEC:
            _one_row_dots(x, w, w2, n, n2, acc, acc2)
        else:
            for k0 in range(t * FLOAT_VEC, width, GEMV_ROW_THREADS * FLOAT_VEC):
                for v in range(FLOAT_VEC):
                    k = k0 + v
                    if k < width:
                        wk = float32(w[n, k])
                        wk2 = float32(w2[n2, k]) if two else float32(0.0)
                        gk = float32(gain[k]) if normed else float32(1.0)
                        for m in range(max_rows):
                            if m < n_rows:
                                xk = x[m, k]
                                if normed:
                                    if has_residual:
                                        xk += residual[m, k]
                                    if writes:
                                        residual_out[m, k] = xk
                                    squares[m] += xk * xk
                                    xk *= gk
                                acc[m] += wk * xk
                                if two:
                                    acc2[m] += wk2 * xk
        _warp_sum_rows(acc, n_rows)
        if two:
            _warp_sum_rows(acc2, n_rows)
        if normed:
            _warp_sum_rows(squares, n_rows)
        if GEMV_ROW_WARPS > 1:  # (the simulator's one warp has no other to add)
            if lane == 0:
                for m in range(max_rows):
                    if m < n_rows:
                        sums[0, warp, m] = acc[m]
                        sums[1, warp, m] = acc2[m]
                        sums[2, warp, m] = squares[m]
            cuda.syncthreads()  # every warp's partial sums written
            for m in range(max_rows):
                if m < n_rows:
                    total, total2, total_squares = sums[0, 0, m], sums[1, 0, m], sums[2, 0, m]
                    for g in range(1, GEMV_ROW_WARPS):
                        total += sums[0, g, m]
                        total2 += sums[1, g, m]
                        total_squares += sums[2, g, m]
                    acc[m], acc2[m], squares[m] = total, total2, total_squares
            cuda.syncthreads()  # read by all before the next row writes sums
        if normed:
            for m in range(max_rows):
                if m < n_rows:
                    # (width is an integer: divided as is, the mean would be float64)
                    scale = float32(1.0) / math.sqrt(squares[m] / float32(width) + eps)
                    acc[m] *= scale
                    if two:
                        acc2[m] *= scale

    @device_function
    def rows_body(x, w, bias, has_bias, out, norm):
        """A block per W row (grid-stride over rows: block b owns rows b, b + blocks,
        ...; row_dots); thread 0 writes its outputs. Traffic: W once, coalesced; x
        (M x K floats) from L1/L2 once per row."""
        sums = cuda.shared.array((3, GEMV_ROW_WARPS, max_rows), dtype=float32)
        acc = cuda.local.array(max_rows, dtype=float32)
        squares = cuda.local.array(max_rows, dtype=float32)
        for n in range(cuda.blockIdx.x, w.shape[0], cuda.gridDim.x):
            row_dots(x, w, None, n, n, n == 0, acc, acc, squares, sums, norm)
            _store_rows(out, bias, has_bias, n, acc, cuda.threadIdx.x, x.shape[0])

    @device_function
    def paired_rows_body(x, w, bias, has_bias, out):
        """rows_body for a matrix of more rows than a wave of blocks takes (lm_head): a
        block per pair of rows, p and p + ceil(N / 2) (an odd N's middle row alone), both
        rows' loads in one pass (row_dots' second matrix): half the blocks, so half the
        waves of a round trip each, and twice the bytes in flight a thread."""
        sums = cuda.shared.array((3, GEMV_ROW_WARPS, max_rows), dtype=float32)
        acc = cuda.local.array(max_rows, dtype=float32)
        acc2 = cuda.local.array(max_rows, dtype=float32)
        squares = cuda.local.array(max_rows, dtype=float32)
        t, n_rows = cuda.threadIdx.x, w.shape[0]
        half = (n_rows + 1) // 2
        for p in range(cuda.blockIdx.x, half, cuda.gridDim.x):
            n2 = p + half if p + half < n_rows else p  # (p again: the middle row, its sum unused)
            row_dots(x, w, w, p, n2, p == 0, acc, acc2, squares, sums, None)
            _store_rows(out, bias, has_bias, p, acc, t, x.shape[0])
            if n2 != p:
                _store_rows(out, bias, has_bias, n2, acc2, t, x.shape[0])

    @device_function
    def qkv_body(x, wq, wk, wv, bq, bk, bv, has_bias, q_out, k_out, v_out, norm):
        """The q, k and v projections in one launch: blocks stride over Nq + 2 Nk rows;
        row g is row g of Wq, then of Wk, then of Wv (layout as rows_body)."""
        sums = cuda.shared.array((3, GEMV_ROW_WARPS, max_rows), dtype=float32)
        nq, nk = wq.shape[0], wk.shape[0]
        acc = cuda.local.array(max_rows, dtype=float32)
        squares = cuda.local.array(max_rows, dtype=float32)
        t = cuda.threadIdx.x
        for g in range(cuda.blockIdx.x, nq + 2 * nk, cuda.gridDim.x):
            # (a call a matrix, not one over a matrix chosen first: choosing made the
            # normed kernel spill)
            if g < nq:
                row_dots(x, wq, None, g, g, g == 0, acc, acc, squares, sums, norm)
                _store_rows(q_out, bq, has_bias, g, acc, t, x.shape[0])
            elif g < nq + nk:
                row_dots(x, wk, None, g - nq, g - nq, False, acc, acc, squares, sums, norm)
                _store_rows(k_out, bk, has_bias, g - nq, acc, t, x.shape[0])
            else:
                row_dots(x, wv, None, g - nq - nk, g - nq - nk, False, acc, acc, squares, sums, norm)
                _store_rows(v_out, bv, has_bias, g - nq - nk, acc, t, x.shape[0])

    @device_function
    def gate_up_body(x, w_gate, w_up, out, norm):
        """The MLP's middle in one launch: out = silu(x @ Wg.T) * (x @ Wu.T); blocks stride
        over the I rows, each taking row n of both matrices (layout as rows_body)."""
        sums = cuda.shared.array((3, GEMV_ROW_WARPS, max_rows), dtype=float32)
        gate = cuda.local.array(max_rows, dtype=float32)
        up = cuda.local.array(max_rows, dtype=float32)
        squares = cuda.local.array(max_rows, dtype=float32)
        for n in range(cuda.blockIdx.x, w_gate.shape[0], cuda.gridDim.x):
            row_dots(x, w_gate, w_up, n, n, n == 0, gate, up, squares, sums, norm)
            if cuda.threadIdx.x == 0:
                for m in range(max_rows):
                    if m < x.shape[0]:
                        g = gate[m]
                        out[m, n] = g / (float32(1.0) + math.exp(-g)) * up[m]

    if normed:
        @jit_bounded(GEMV_BOUNDS)
        def gemv_rows_normed(x, w, bias, has_bias, out, norm):
            rows_body(x, w, bias, has_bias, out, norm)

        @jit_bounded(GEMV_BOUNDS)
        def gemv_qkv_normed(x, wq, wk, wv, bq, bk, bv, has_bias, q_out, k_out, v_out, norm):
            qkv_body(x, wq, wk, wv, bq, bk, bv, has_bias, q_out, k_out, v_out, norm)

        @jit_bounded(GEMV_BOUNDS)
        def gemv_gate_up_silu_normed(x, w_gate, w_up, out, norm):
            gate_up_body(x, w_gate, w_up, out, norm)
        # (no paired one: it spilled 16 bytes; a NormedRows' rows are written for it)
        return gemv_rows_normed, gemv_qkv_normed, gemv_gate_up_silu_normed

    if one_row:
        @jit_bounded(GEMV_BOUNDS)
        def gemv_one_row(x, w, bias, has_bias, out):
            rows_body(x, w, bias, has_bias, out, None)

        @jit_bounded(GEMV_BOUNDS)
        def gemv_one_row_paired(x, w, bias, has_bias, out):
            paired_rows_body(x, w, bias, has_bias, out)
        # (q|k|v and gate/up take the norm folded at batch 1: normed kernels, whose
        # hoisted loads spilled; a one-row gate/up spilled 72 bytes)
        return gemv_one_row, gemv_one_row_paired

    @jit_bounded(GEMV_BOUNDS)
    def gemv_rows(x, w, bias, has_bias, out):
        rows_body(x, w, bias, has_bias, out, None)

    @jit_bounded(GEMV_BOUNDS)
    def gemv_paired_rows(x, w, bias, has_bias, out):
        paired_rows_body(x, w, bias, has_bias, out)  # (no norm folded: lm_head's is launched)

    @jit_bounded(GEMV_BOUNDS)
    def gemv_qkv(x, wq, wk, wv, bq, bk, bv, has_bias, q_out, k_out, v_out):
        qkv_body(x, wq, wk, wv, bq, bk, bv, has_bias, q_out, k_out, v_out, None)

    @jit_bounded(GEMV_BOUNDS)
    def gemv_gate_up_silu(x, w_gate, w_up, out):
        gate_up_body(x, w_gate, w_up, out, None)
    return gemv_rows, gemv_qkv, gemv_gate_up_silu, gemv_paired_rows


gemv_rows, gemv_qkv, gemv_gate_up_silu, gemv_paired_rows = _float_gemvs(normed=False)
# gemv_rows and gemv_paired_rows for one row of x (batch 1), each step's loads hoisted
gemv_one_row, gemv_one_row_paired = _float_gemvs(normed=False, one_row=True)
# the same three with the RMSNorm before them folded in (normed_rows.py)
NORMED_GEMVS = _float_gemvs(normed=True)


def pairs_rows(rows: int) -> bool:
    """Whether a float GEMV over `rows` weight rows takes them in pairs (gemv_paired_rows):
    past PAIRED_FROM_ROWS, more blocks than a wave holds."""
    return rows > PAIRED_FROM_ROWS


def gemv_blocks(rows: int) -> int:
    """Blocks for a GEMV over `rows` weight rows: a block per row. The row loops are
    grid-stride, so fewer blocks give the same rows to fewer blocks: on the simulator,
    which runs a Python thread per CUDA thread, two (the grid-stride loops are what
    its tests then exercise)."""
    return min(SIMULATOR_GEMV_BLOCKS, rows) if config.ENABLE_CUDASIM else rows

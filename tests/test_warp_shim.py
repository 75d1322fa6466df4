"""The simulator's warp intrinsics (tests/warp_shim.py) against their CUDA
semantics, and the failures it must report: a kernel whose lanes diverge at a
shuffle, or meet at different shuffles, fails instead of passing by luck."""
import numpy as np
import pytest
from numba import cuda, float32

import warp_shim
from tinypaged.kernels.cuda import cuda_simulated

pytestmark = pytest.mark.cuda
FULL = 0xFFFFFFFF


@cuda.jit
def _reduce_and_move(x, sums, moved):
    """Per warp: a butterfly sum (shfl_xor), a tree sum (shfl_down), and each lane's
    value broadcast from lane 0, rotated by one, and shifted up by one."""
    i = cuda.grid(1)
    v = x[i]
    mask = FULL if cuda.blockDim.x - (cuda.threadIdx.x // 32) * 32 >= 32 else \
        (1 << (cuda.blockDim.x % 32)) - 1
    total = v
    offset = 16
    while offset > 0:
        total += cuda.shfl_xor_sync(mask, total, offset)
        offset //= 2
    tree = v
    offset = 16
    while offset > 0:
        tree += cuda.shfl_down_sync(mask, tree, offset)
        offset //= 2
    lane = cuda.threadIdx.x % 32
    sums[i, 0] = total
    sums[i, 1] = tree
    moved[i, 0] = cuda.shfl_sync(mask, v, 0)
    moved[i, 1] = cuda.shfl_sync(mask, v, (lane + 1) % 32)
    moved[i, 2] = cuda.shfl_up_sync(mask, v, 1)
    cuda.syncwarp(mask)


def test_shuffles_follow_cuda_semantics_over_full_warps():
    x = np.arange(64, dtype=np.float32) * float32(0.5)
    sums, moved = np.zeros((64, 2), np.float32), np.zeros((64, 3), np.float32)
    _reduce_and_move[1, 64](x, sums, moved)
    warps = x.reshape(2, 32)
    np.testing.assert_array_equal(sums[:, 0], np.repeat(warps.sum(1), 32))  # every lane
    np.testing.assert_array_equal(sums[::32, 1], warps.sum(1))  # lane 0 holds the tree's sum
    np.testing.assert_array_equal(moved[:, 0], np.repeat(warps[:, 0], 32))
    np.testing.assert_array_equal(moved[:, 1], np.roll(warps, -1, axis=1).reshape(-1))
    up = np.concatenate([warps[:, :1], warps[:, :-1]], axis=1)  # lane 0 keeps its own
    np.testing.assert_array_equal(moved[:, 2], up.reshape(-1))


@cuda.jit
def _divergent(x, out):
    """Lanes 16-31 leave before the shuffle the others wait in."""
    i = cuda.grid(1)
    if cuda.threadIdx.x >= 16:
        return
    out[i] = cuda.shfl_xor_sync(FULL, x[i], 1)


@cuda.jit
def _mismatched(x, out):
    """Even lanes shuffle down, odd lanes xor: two different calls at one meeting."""
    i = cuda.grid(1)
    if cuda.threadIdx.x % 2 == 0:
        out[i] = cuda.shfl_down_sync(FULL, x[i], 1)
    else:
        out[i] = cuda.shfl_xor_sync(FULL, x[i], 1)


@cuda.jit
def _uneven_loop(x, out):
    """Lane 3 runs its shuffle loop once more than the others."""
    i = cuda.grid(1)
    v = x[i]
    for _ in range(2 + (cuda.threadIdx.x == 3)):
        v += cuda.shfl_xor_sync(FULL, v, 1)
    out[i] = v


@cuda.jit
def _partial_mask(x, out):
    i = cuda.grid(1)
    out[i] = cuda.shfl_xor_sync(0xFFFF, x[i], 1)  # half a warp named, all 32 lanes there


@pytest.mark.skipif(not cuda_simulated(), reason="the shim's own failures are the simulator's")
@pytest.mark.parametrize("kernel, message", [(_divergent, "divergent"), (_mismatched, "mismatched"),
                                             (_uneven_loop, "divergent|mismatched"),
                                             (_partial_mask, "mask")])
def test_divergent_or_mismatched_shuffles_fail(kernel, message):
    x = np.arange(32, dtype=np.float32)
    with pytest.raises(warp_shim.WarpError, match=message):
        kernel[1, 32](x, np.zeros(32, np.float32))


@cuda.jit
def _reductions_both_ways(x, fast, shuffled):
    """warp_sum and warp_max (one exchange each in the shim), and the same butterflies
    written out with shfl_xor_sync (five exchanges each)."""
    from tinypaged.kernels.cuda.warp import warp_max, warp_sum
    i = cuda.grid(1)
    fast[i, 0] = warp_sum(x[i])
    fast[i, 1] = warp_max(x[i])
    total, top = x[i], x[i]
    offset = 16
    while offset > 0:
        total += cuda.shfl_xor_sync(FULL, total, offset)
        top = max(top, cuda.shfl_xor_sync(FULL, top, offset))
        offset //= 2
    shuffled[i, 0], shuffled[i, 1] = total, top


def test_the_shims_warp_reductions_give_the_butterflys_bits():
    """Random values over many magnitudes; and a warp whose sum tells the order: 1e8
    in lane 0, -1e8 in lane 16, ones elsewhere: the butterfly adds lanes i and i ^ 16
    first (30 in all), a sum from lane 0 on loses each one to 1e8's spacing (15)."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(64) * 10.0 ** rng.integers(-6, 6, 64)).astype(np.float32)
    x[32:] = 1.0
    x[32], x[48] = 1e8, -1e8
    fast, shuffled = np.zeros((64, 2), np.float32), np.zeros((64, 2), np.float32)
    _reductions_both_ways[1, 64](x, fast, shuffled)
    np.testing.assert_array_equal(fast, shuffled)
    assert (fast[32:, 0] == 30).all() and np.cumsum(x[32:], dtype=np.float32)[-1] == 15

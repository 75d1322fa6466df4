"""The bit oracle of the CPU's packed products (kernels/cpu/lanes_product.py).

A packed product rounds x to int8 per 32-block (kernels/reference.py), takes each
block's exact integer dot with the weight's block, and scales it in one fixed
float32 sequence, blocks in order (kernels/cpu/LANES.md):

    acc = 0
    acc = fma(dx, term, acc)   with term = scale * dot                   (Q8_0, Q4_0, Q5_0, Q6_K)
                                          fma(min, qsum, scale * dot)    (Q4_1, Q5_1, Q4_K, Q5_K)

Written here from the formats' own reading of the blocks (PackedWeight.values): the
integer dots in NumPy's int64, the float steps one at a time in numba (NumPy has no
fused multiply-add). Every row of x gives the same bits alone or in any batch, which
is the contract the kernels are held to.
"""
import numpy as np
from llvmlite import ir
from numba import float32, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from tinypaged.formats.quant_kind import Q4_0, Q4_K, Q5_0, Q5_K, Q6_K
from tinypaged.kernels import reference

OFFSET = {Q4_0: 8, Q5_0: 16, Q6_K: 32}  # what the stored q carry above the signed weight


@intrinsic
def fma32(typingctx, a, b, c):
    """a * b + c in float32 with one rounding (llvm.fma, as the kernels' llvm.fma.v16f32)."""
    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32] * 3),
                                             "llvm.fma.f32")
        return builder.call(fma, args)
    return types.float32(types.float32, types.float32, types.float32), codegen


def _halfs(bits: np.ndarray) -> np.ndarray:
    return bits.view(np.float16).astype(np.float32)


def block_integers(weight) -> np.ndarray:
    """(N, K/32, 32) int64: the integers w whose dot with x's int8 block is the block's
    dot (Q6_K: its int8 sub-scale of each 16 times q - 32)."""
    n, k = weight.shape
    w = weight.values().astype(np.int64) - OFFSET.get(weight.ggml_type, 0)
    if weight.ggml_type == Q6_K:
        w *= np.repeat(weight.scales.astype(np.int64), 16, axis=1)
    return w.reshape(n, k // 32, 32)


def block_scales(weight) -> tuple[np.ndarray, np.ndarray | None]:
    """Each block's float32 scale and min (None for the kinds without mins), (N, K/32)."""
    if weight.supers is None:
        return _halfs(weight.scales), None if weight.mins is None else _halfs(weight.mins)
    d = np.repeat(_halfs(weight.supers[:, :, 0]), 8, axis=1)  # a super-block: 8 blocks
    if weight.ggml_type == Q6_K:
        return d, None
    assert weight.ggml_type in (Q4_K, Q5_K)
    dmin = np.repeat(_halfs(weight.supers[:, :, 1]), 8, axis=1)
    return d * weight.scales.astype(np.float32), -(dmin * weight.mins.astype(np.float32))


@njit
def _scaled_sums(dots, dx, qsum, scales, mins, with_min, out):
    """out[m, n] from the integer dots (M, N, B), in the float steps of the docstring."""
    for m in range(dots.shape[0]):
        for n in range(dots.shape[1]):
            acc = float32(0.0)
            for b in range(dots.shape[2]):
                term = scales[n, b] * float32(dots[m, n, b])
                if with_min:
                    term = fma32(mins[n, b], float32(qsum[m, b]), term)
                acc = fma32(dx[m, b], term, acc)
            out[m, n] = acc


def oracle_product(x: np.ndarray, weight) -> np.ndarray:
    """round_activations(x) (M, K) @ W.T for a PackedWeight W, (M, N) float32, with the
    bits every CPU product must give each row."""
    xq, dx = reference.quantize_activations(np.asarray(x, np.float32))
    blocks = xq.reshape(len(x), -1, 32).astype(np.int64)  # (M, B, 32)
    dots = np.einsum("nbk,mbk->mnb", block_integers(weight), blocks)
    scales, mins = block_scales(weight)
    out = np.empty((len(x), weight.shape[0]), np.float32)
    _scaled_sums(dots, dx, blocks.sum(2), scales, np.zeros_like(scales) if mins is None else mins,
                 mins is not None, out)
    return out

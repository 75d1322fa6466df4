"""CUDA kernels for the per-token ops, fused where that saves a launch or a pass:
add + RMSNorm, RoPE + KV write, SiLU-mul, embedding gather, row gather, and the
block copy behind copy-on-write."""
import math

from numba import config, cuda, float32

from .device_function import device_function
from .disk_cache import cached_kernel
from .exact import add_rn, mul_rn, sub_rn
from ...formats.quant_kind import QK
from .warp import WARP, warp_max, warp_sum

# add_rms_norm: threads per token row (hidden up to 1024 in one pass); the simulator runs
# a Python thread per CUDA thread, so it takes two warps (the cross-warp sum still runs)
GPU_NORM_THREADS = 1024
NORM_THREADS = 64 if config.ENABLE_CUDASIM else GPU_NORM_THREADS
NORM_WARPS = NORM_THREADS // WARP
ROW_THREADS = 32  # row-wise copies: threads per row


@cached_kernel()
def add_rms_norm(x, residual, has_residual, weight, eps, out, residual_out, rounded, do_round):
    """Grid (T,), block NORM_THREADS. Row t: r = x + residual (stored in residual_out,
    which may be residual itself) or x alone, out = r * rsqrt(mean(r^2) + eps) *
    weight. One read of x and residual, one write of each output; a block per row, so
    a hidden size of up to NORM_THREADS is one load per thread, all in flight at once
    (a warp walking the row waits on each of its steps). The sum of squares: each warp's by a shfl_xor
    butterfly, then the warps' in order from shared memory (the same order every run:
    a replayed step equals the eager one bit for bit). do_round (hidden a multiple of
    32): rounded also gets out as products with packed weights take it
    (reference.round_activations), each block of 32 values being one warp's step,
    its max met by shuffles: that saves a round_activations launch before the packed
    q/k/v and gate/up products."""
    scratch = cuda.shared.array(NORM_WARPS, dtype=float32)
    row, t = cuda.blockIdx.x, cuda.threadIdx.x
    hidden = x.shape[1]
    ss = float32(0.0)
    kept, kept_weight = float32(0.0), float32(0.0)  # a row of at most NORM_THREADS: this
    for i in range(t, hidden, NORM_THREADS):        # thread's value and weight, kept
        v = x[row, i]
        if has_residual:
            v += residual[row, i]
            residual_out[row, i] = v
        ss += v * v
        kept, kept_weight = v, weight[i]  # (loaded with x: no second round trip)
    ss = warp_sum(ss)
    if t % WARP == 0:
        scratch[t // WARP] = ss
    cuda.syncthreads()  # every warp's sum written
    total = scratch[0]
    for w in range(1, NORM_WARPS):
        total += scratch[w]
    # (hidden is an integer: divided as is, the mean would be float64 on the GPU)
    scale = float32(1.0) / math.sqrt(total / float32(hidden) + eps)
    for i0 in range(0, hidden, NORM_THREADS):  # (every lane takes every step: shuffles)
        i = i0 + t
        v = float32(0.0)
        if i < hidden:
            if hidden <= NORM_THREADS:
                v = kept * scale * kept_weight
            else:
                v = (residual_out[row, i] if has_residual else x[row, i]) * scale * weight[i]
            out[row, i] = v
        if do_round:
            d, inverse = block_step(warp_max(abs(v)))
            if i < hidden:
                rounded[row, i] = to_step(v, d, inverse)


@device_function
def block_step(amax):
    """(d, 1 / d) of a 32-value block whose largest magnitude is amax: d = amax / 127
    (0 and 0 for a block of zeros), as reference.quantize_activations computes them."""
    d = float32(amax / float32(127.0))  # (the quotient is float64: rounded once to float32)
    inverse = float32(float32(1.0) / d) if d > float32(0.0) else float32(0.0)
    return d, inverse


@device_function
def to_int_step(v, inverse):
    """round-half-even(v / d) (a float holding an integer of -127..127), in float32,
    never fused (exact.py: v * inverse + HALF_EVEN as one FMA would round differently)."""
    return sub_rn(add_rn(mul_rn(v, inverse), HALF_EVEN), HALF_EVEN)


@device_function
def to_step(v, d, inverse):
    """v as d * round-half-even(v / d), all in float32 (reference.round_activations)."""
    return mul_rn(d, to_int_step(v, inverse))


@device_function
def rotate_pair(a, b, c, s):
    """Rotate-half RoPE of the pair (a, b) by the angle whose cosine and sine are c, s;
    products rounded before they are summed, as the reference (exact.py)."""
    return sub_rn(mul_rn(a, c), mul_rn(b, s)), add_rn(mul_rn(b, c), mul_rn(a, s))


@cached_kernel()
def rope_write_kv(q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping):
    """Grid (T, n_heads + n_kv), block (D / 2,). Block (t, j): for a query head
    (j < n_heads) rotate q[t, j] in place; for a KV head rotate k and write k and v
    to slot slot_mapping[t]. Rotate-half: pair (i, i + D/2) turns by the angle of
    position positions[t]. A padding row of a static decode step (position -1)
    exits at once: nothing to rotate, nothing to write."""
    t, j, i = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    half = q.shape[2] // 2
    p = positions[t]
    if i >= half or p < 0:
        return
    c, s = cos_table[p, i], sin_table[p, i]
    n_heads = q.shape[1]
    if j < n_heads:
        q[t, j, i], q[t, j, i + half] = rotate_pair(q[t, j, i], q[t, j, i + half], c, s)
    else:
        kvh = j - n_heads
        block_size = k_cache.shape[1]
        block, offset = slot_mapping[t] // block_size, slot_mapping[t] % block_size
        k_cache[block, offset, kvh, i], k_cache[block, offset, kvh, i + half] = rotate_pair(
            k[t, kvh, i], k[t, kvh, i + half], c, s)
        v_cache[block, offset, kvh, i] = v[t, kvh, i]
        v_cache[block, offset, kvh, i + half] = v[t, kvh, i + half]


@cached_kernel()
def silu_mul(gate, up, out):
    """1-D grid over T * I elements: out = silu(gate) * up."""
    e = cuda.grid(1)
    width = gate.shape[1]
    if e < gate.shape[0] * width:
        t, i = e // width, e % width
        g = gate[t, i]
        out[t, i] = g / (float32(1.0) + math.exp(-g)) * up[t, i]


@cached_kernel()
def gelu_tanh_mul(gate, up, out):
    """1-D grid over T * I elements: out = gelu_tanh(gate) * up."""
    e = cuda.grid(1)
    width = gate.shape[1]
    if e < gate.shape[0] * width:
        t, i = e // width, e % width
        g = gate[t, i]
        inner = float32(0.7978845608028654) * (g + float32(0.044715) * g * g * g)
        out[t, i] = float32(0.5) * g * (float32(1.0) + math.tanh(inner)) * up[t, i]


@cached_kernel()
def softcap(x, cap, out):
    """1-D grid over T * V elements: out = cap * tanh(x / cap) (Gemma 2's logits)."""
    e = cuda.grid(1)
    width = x.shape[1]
    if e < x.shape[0] * width:
        t, i = e // width, e % width
        out[t, i] = cap * math.tanh(x[t, i] / cap)


@cached_kernel()
def scale(x, factor, out):
    """1-D grid over T * H elements: out = x * factor."""
    e = cuda.grid(1)
    width = x.shape[1]
    if e < x.shape[0] * width:
        out[e // width, e % width] = x[e // width, e % width] * factor


@cached_kernel()
def add(x, y, out):
    """1-D grid over T * H elements: out = x + y."""
    e = cuda.grid(1)
    width = x.shape[1]
    if e < x.shape[0] * width:
        t, i = e // width, e % width
        out[t, i] = x[t, i] + y[t, i]


@cached_kernel()
def gather_rows(table, indices, out):
    """Grid (len(indices),), block ROW_THREADS: out[r] = table[indices[r]] (embedding
    lookup for token ids, or picking the rows that need logits)."""
    r, t = cuda.blockIdx.x, cuda.threadIdx.x
    src = indices[r]
    for i in range(t, out.shape[1], ROW_THREADS):
        out[r, i] = table[src, i]


@cached_kernel()
def copy_blocks(k_pool, v_pool, pairs):
    """Grid (len(pairs), n_layers), block ROW_THREADS: block dst = pairs[i, 1] of a
    layer gets the K/V of block src = pairs[i, 0] (copy-on-write)."""
    i, layer, t = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    src, dst = pairs[i, 0], pairs[i, 1]
    block_size, n_kv, head_dim = k_pool.shape[2], k_pool.shape[3], k_pool.shape[4]
    for e in range(t, block_size * n_kv * head_dim, ROW_THREADS):
        o, rest = e // (n_kv * head_dim), e % (n_kv * head_dim)
        hh, d = rest // head_dim, rest % head_dim
        k_pool[layer, dst, o, hh, d] = k_pool[layer, src, o, hh, d]
        v_pool[layer, dst, o, hh, d] = v_pool[layer, src, o, hh, d]


ROUND_THREADS = 64  # round_activations: threads per block, one 32-value block of x each
HALF_EVEN = float32(12582912.0)  # 1.5 * 2^23: (v + this) - this rounds |v| < 2^22 half to even


@cached_kernel()
def round_activations(x, out):
    """x (M, K) as a packed weight takes it (reference.round_activations): per block of
    32 values, d = max|x| / 127 and out = d * round-half-even(x / d). 1-D grid, one
    thread per block of 32 (M * K / 32 threads): two passes over 128 bytes."""
    g = cuda.grid(1)
    per_row = x.shape[1] // QK
    if g >= x.shape[0] * per_row:
        return
    m, k0 = g // per_row, (g % per_row) * QK
    amax = float32(0.0)
    for k in range(k0, k0 + QK):
        amax = max(amax, abs(x[m, k]))
    d, inverse = block_step(amax)
    for k in range(k0, k0 + QK):
        out[m, k] = to_step(x[m, k], d, inverse)

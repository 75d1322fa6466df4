"""LoRA's low-rank terms on the GPU (reference.add_lora is the spec): two launches per
adapted product. shrink: t = x A^T * scale, a block per (adapted row, rank index),
the dot summed in a fixed order; expand: y += t B^T, a thread per output value.
Every row runs the same sums whatever else is in the batch."""
from numba import config, cuda, float32

from ..reference import lora_stacks  # noqa: F401 (the backend's: the list as it is)
from .disk_cache import cached_kernel

# threads per shrink block (a power of two: the tree sum halves it); the simulator
# runs a Python thread per CUDA thread, so it takes fewer
SHRINK_THREADS = 32 if config.ENABLE_CUDASIM else 128
EXPAND_THREADS = 32 if config.ENABLE_CUDASIM else 128


@cached_kernel()
def lora_shrink(x, a, ranks, scales, rows, slots, t):
    """Grid (n, R), block SHRINK_THREADS: t[k, j] = scales[s] * (x[rows[k]] . a[s, j])
    for j < ranks[s], else 0 (s = slots[k]): strided partial sums, then a tree sum
    over shared memory."""
    partial = cuda.shared.array(SHRINK_THREADS, dtype=float32)
    k, j, tid = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    s, row = slots[k], rows[k]
    acc = float32(0.0)
    if j < ranks[s]:  # (the same for the whole block)
        for i in range(tid, x.shape[1], SHRINK_THREADS):
            acc += float32(x[row, i]) * float32(a[s, j, i])
    partial[tid] = acc
    cuda.syncthreads()  # every thread's partial sum written
    half = SHRINK_THREADS // 2
    while half > 0:
        if tid < half:
            partial[tid] += partial[tid + half]
        cuda.syncthreads()  # this level's sums written before the next reads them
        half //= 2
    if tid == 0:
        t[k, j] = partial[0] * scales[s]


@cached_kernel()
def lora_expand(t, bt, ranks, rows, slots, y):
    """Grid (n, ceil(out / EXPAND_THREADS)), block EXPAND_THREADS: y[rows[k], o] +=
    sum over j < ranks[s] of t[k, j] * bt[s, j, o]."""
    k = cuda.blockIdx.x
    o = cuda.blockIdx.y * EXPAND_THREADS + cuda.threadIdx.x
    if o < y.shape[1]:
        s = slots[k]
        acc = float32(0.0)
        for j in range(ranks[s]):
            acc += t[k, j] * float32(bt[s, j, o])
        y[rows[k], o] += acc


def add_lora(launcher, x, ys, stacks, rows, slots):
    """reference.add_lora on device arrays (stacks as reference.lora_stacks makes them;
    rows, slots: int32 device arrays, as lora_groups uploads them; a and bt float32 or
    float16, widened as read)."""
    n = len(rows)
    for y, (a, bt, ranks, scales) in zip(ys, stacks):
        t = launcher.empty(n, a.shape[1])
        launcher(lora_shrink, (n, a.shape[1]), SHRINK_THREADS, x, a, ranks, scales, rows, slots, t)
        launcher(lora_expand, (n, -(-y.shape[1] // EXPAND_THREADS)), EXPAND_THREADS,
                 t, bt, ranks, rows, slots, y)

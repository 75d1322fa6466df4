"""A latency model of one recorded decode step on a GPU: per kernel, its launches,
bytes, blocks and the memory round trips its threads wait through one after the
other; the step's predicted time and which kernel bounds it.

At batch 1 a small model's step moves ~270 MB (SmolLM2 in float16: 63 us at the
H200's 4 TB/s), but runs ~245 kernels, each of which waits on memory a few times in
sequence: the time is latency, not bandwidth. So a kernel costs

    node + max(bytes / bandwidth, waves x rounds x round_trip) + syncs x barrier

with `rounds` the dependent memory accesses of one thread (loads that go out
together count once), `waves` the times the grid fills the GPU. The constants
(ASSUMPTIONS) are measured on an H200 or rounded up from its figures; NOTES
(2026-12-04) says how, and how far the model missed per kernel there: read its
total, and measure again when a GPU is lent.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

ASSUMPTIONS = {
    "node_us": 0.51,  # a kernel node of a replayed graph (measured)
    "bandwidth_gbps": 4000.0,  # device copy, read + write (measured)
    "round_trip_us": 1.0,  # one dependent global load, L2 or HBM (rounded up)
    "sync_us": 0.25,  # a barrier, a shuffle butterfly or a shared-memory pass
    "sms": 132,
    "threads_per_sm": 2048,
}


@dataclass(frozen=True, slots=True)
class KernelCost:
    name: str
    per_step: int  # launches of it a step
    bytes: int  # moved by one launch
    blocks: int
    threads: int  # a block
    rounds: int  # dependent memory round trips of one thread
    syncs: int  # barriers, butterflies, shared-memory passes, in sequence
    per_sm: int = 0  # blocks an SM holds at once where registers bound it (0: threads do)

    def waves(self, a=ASSUMPTIONS) -> int:
        per_wave = a["sms"] * (self.per_sm or max(1, a["threads_per_sm"] // self.threads))
        return max(1, math.ceil(self.blocks / per_wave))

    def micros(self, a=ASSUMPTIONS) -> float:
        """Predicted device microseconds of one launch."""
        memory = max(self.bytes / (a["bandwidth_gbps"] * 1e3),
                     self.waves(a) * self.rounds * a["round_trip_us"])
        return a["node_us"] + memory + self.syncs * a["sync_us"]


def decode_step(hidden, layers, heads, kv_heads, head_dim, intermediate, vocab,
                batch=1, context=64, weight_bytes=2):
    """The kernels of one batch-`batch` decode step of a Llama-shaped model at
    `context` keys, as this backend's design launches them (float weights of
    weight_bytes each, float32 KV pool and activations)."""
    from ..attention import GPU_CHUNK, LANES_PER_KEY, MIN_DECODE_CHUNKS, decode_block_cost, decode_split
    from ..memory import covering_keys
    from ..elementwise import GPU_NORM_THREADS as NORM_THREADS  # (not the simulator's)
    from ..matmul import GEMV_MAX_ROWS, GEMV_THREADS, VEC
    if batch > GEMV_MAX_ROWS:
        raise ValueError(f"batch={batch}: the model covers the GEMV steps (batch <= "
                         f"{GEMV_MAX_ROWS}); larger batches run the tiled product")

    def gemv_rounds(width):  # a thread's steps along a row (gate and up go together)
        return math.ceil(width / (GEMV_THREADS * VEC))

    # the decode attention's split as the backend picks it on a GPU (GPU_CHUNK-key
    # chunks, one block an SM: its registers), each block's chunks one after another
    keys = covering_keys(context, MIN_DECODE_CHUNKS * GPU_CHUNK)
    parts, partition = decode_split(batch, kv_heads, heads // kv_heads, keys, ASSUMPTIONS["sms"], GPU_CHUNK)
    chunks = math.ceil(min(context, partition) / GPU_CHUNK)
    act = 4 * batch
    kv_bytes = 2 * batch * kv_heads * context * head_dim * 4
    partials = 2 * batch * heads * parts * (head_dim + 2) * 4  # written, then read by the merge
    kernels = [
        # the embedding, then the rows whose logits are wanted (hidden and residual)
        KernelCost("gather_rows", 3, act * hidden + weight_bytes * batch * hidden,
                   batch, 32, 1, 0),
        KernelCost("add_rms_norm", 2 * layers + 1, 3 * act * hidden, batch, NORM_THREADS,
                   1 if hidden <= NORM_THREADS else 2, 3),
        KernelCost("gemv_qkv", layers, weight_bytes * hidden * (heads + 2 * kv_heads) * head_dim,
                   (heads + 2 * kv_heads) * head_dim, GEMV_THREADS, gemv_rounds(hidden), 2),
        KernelCost("rope_write_kv", layers, act * 2 * (heads + 2 * kv_heads) * head_dim,
                   batch * (heads + kv_heads), head_dim // 2, 2, 0),
        # the row's position, then its first block id (2 round trips); a chunk: K/V (the
        # next chunk's block id in flight meanwhile); key shuffles, barrier, softmax
        # butterflies, barrier, the weighted sum from shared memory, barrier; the last
        # block's merge where there are partitions
        KernelCost("paged_attention_decode", layers, kv_bytes + (parts > 1) * partials,
                   batch * kv_heads * parts, GPU_CHUNK * LANES_PER_KEY, *decode_block_cost(chunks, parts),
                   per_sm=1),
        KernelCost("gemv_rows (o_proj)", layers, weight_bytes * heads * head_dim * hidden,
                   hidden, GEMV_THREADS, gemv_rounds(heads * head_dim), 2),
        KernelCost("gemv_gate_up_silu", layers, 2 * weight_bytes * hidden * intermediate,
                   intermediate, GEMV_THREADS, gemv_rounds(hidden), 4),
        KernelCost("gemv_rows (down_proj)", layers, weight_bytes * intermediate * hidden,
                   hidden, GEMV_THREADS, gemv_rounds(intermediate), 2),
        KernelCost("gemv_rows (lm_head)", 1, weight_bytes * vocab * hidden, vocab,
                   GEMV_THREADS, gemv_rounds(hidden), 2),
        KernelCost("argmax (top_candidates)", 1, act * vocab, batch, 256, 2, 4),
    ]
    return kernels


def predict(kernels, a=ASSUMPTIONS) -> dict:
    """Step microseconds, tokens/s at the step's batch, and the kernel that costs most."""
    costs = [(k.per_step * k.micros(a), k) for k in kernels]
    total = sum(c for c, _ in costs)
    worst = max(costs, key=lambda c: c[0])[1]
    return {"step_us": total, "launches": sum(k.per_step for k in kernels),
            "bound_by": worst.name, "costs": costs}


def report(kernels, batch, a=ASSUMPTIONS) -> str:
    """The table, the assumptions and the prediction, as printed by ptx.py --step-model."""
    result = predict(kernels, a)
    lines = [f"{'kernel':<28}{'a step':>7}{'bytes':>12}{'blocks':>8}{'rounds':>7}"
             f"{'waves':>6}{'us each':>9}{'us a step':>10}"]
    for cost, k in sorted(result["costs"], key=lambda c: -c[0]):
        lines.append(f"{k.name:<28}{k.per_step:>7}{k.bytes:>12}{k.blocks:>8}{k.rounds:>7}"
                     f"{k.waves(a):>6}{k.micros(a):>9.2f}{cost:>10.1f}")
    lines.append("assumptions: " + ", ".join(f"{k}={v}" for k, v in a.items()))
    lines.append(f"predicted step: {result['step_us']:.0f} us, {result['launches']} launches: "
                 f"{batch * 1e6 / result['step_us']:.0f} tokens/s at batch {batch}; "
                 f"bound by {result['bound_by']}")
    return "\n".join(lines)

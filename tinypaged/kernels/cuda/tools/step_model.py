"""A latency model of one recorded decode step, and of a prompt's prefill, on a GPU: per
kernel, its launches, bytes, blocks, the memory round trips its threads wait through
one after the other and its shared-memory loads; the step's predicted time and which
kernel bounds it.

At batch 1 a small model's step moves ~270 MB (SmolLM2 in float16: 63 us at the
H200's 4 TB/s), but runs ~245 kernels, each of which waits on memory a few times in
sequence: the time is latency, not bandwidth. So a kernel costs

    node + max(bytes / bandwidth, waves x rounds x round_trip, shared loads / rate)
         + syncs x barrier

with `rounds` the dependent memory accesses of one thread (loads that go out
together count once), `waves` the times the grid fills the GPU. The third term is the
compute kernels' (the tiled products at batch 9-64 and in prefill, prefill attention):
both read each operand of their FMAs from shared memory, at one warp-wide load an SM a
clock, which bounds them before the FMA units do (a 4 x 4 patch: 8 loads for 16 FMAs;
4 FMAs an SM a clock). The constants (ASSUMPTIONS) are measured on an H200, rounded
up from its figures, or (marked) the card's specification; NOTES (2026-12-04) says how,
and how far the model missed per kernel there: read its total, and measure again when
a GPU is lent.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ....formats.quant_kind import KINDS

ASSUMPTIONS = {
    "node_us": 0.51,  # a kernel node of a replayed graph (measured)
    "bandwidth_gbps": 4000.0,  # device copy, read + write (measured)
    "round_trip_us": 1.0,  # one dependent global load, L2 or HBM (rounded up)
    # a dependent load that hits L1 (~33 clocks at 1.98 GHz, rounded up; the 8-row GEMV
    # loops wait on each weight of a step: bench/sass.py)
    "l1_hit_us": 0.02,
    "sync_us": 0.25,  # a barrier, a shuffle butterfly or a shared-memory pass
    "sms": 132,
    "threads_per_sm": 2048,
    "sm_clock_ghz": 1.98,  # (specification: H100 and H200 SXM, boost)
    "shared_loads_per_sm_clock": 1.0,  # warp-wide, without bank conflicts (specification)
}


# packed schemes as GGUF files hold them, by product: Q4_K_M keeps down_proj (in half
# the layers; here all) and the output matrix in Q6_K, the rest Q4_K
_CODE = {kind.name: code for code, kind in KINDS.items()}
PACKED = {"Q4_K_M": {"qkv": _CODE["Q4_K"], "o_proj": _CODE["Q4_K"], "gate_up": _CODE["Q4_K"],
                     "down_proj": _CODE["Q6_K"], "lm_head": _CODE["Q6_K"]},
          # (the default GGUF, SmolLM2's Q4_1, holds its output matrix in Q8_0)
          **{name: {**dict.fromkeys(("qkv", "o_proj", "gate_up", "down_proj"), _CODE[name]),
                    "lm_head": _CODE["Q8_0"]} for name in ("Q8_0", "Q4_1")}}


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
    shared_loads: int = 0  # warp-wide shared-memory loads of one launch (compute kernels)
    l1_waits: int = 0  # dependent loads of one thread that hit L1, after its round trips

    def waves(self, a=ASSUMPTIONS) -> int:
        per_wave = a["sms"] * (self.per_sm or max(1, a["threads_per_sm"] // self.threads))
        return max(1, math.ceil(self.blocks / per_wave))

    def micros(self, a=ASSUMPTIONS) -> float:
        """Predicted device microseconds of one launch."""
        shared = self.shared_loads / (a["sms"] * a["sm_clock_ghz"] * 1e3 * a["shared_loads_per_sm_clock"])
        memory = max(self.bytes / (a["bandwidth_gbps"] * 1e3),
                     self.waves(a) * (self.rounds * a["round_trip_us"] + self.l1_waits * a["l1_hit_us"]),
                     shared)
        return a["node_us"] + memory + self.syncs * a["sync_us"]


def tiled_product(name, per_step, rows, cols, width, weight_bytes=2, a=ASSUMPTIONS) -> KernelCost:
    """The tiled product (tiled_matmul.py) of (rows x width) @ (width x cols) as a GPU
    launches it: K split to fill the SMs; a block's slices one after another, each
    waiting a round trip (its loads went out a slice ahead) and two barriers, over the
    waves; then the last block's merge of the splits."""
    from ..tiled_matmul import GPU_DEPTH, GPU_PATCH, GPU_TILE, SPLITS_AT_ONCE, TILED_BOUNDS, tiled_split
    splits, k_span = tiled_split(rows, cols, width, a["sms"], GPU_TILE, GPU_DEPTH)
    row_tiles, col_tiles = math.ceil(rows / GPU_TILE), math.ceil(cols / GPU_TILE)
    blocks, slices = row_tiles * col_tiles * splits, k_span // GPU_DEPTH
    threads = (GPU_TILE // GPU_PATCH) ** 2
    waves = math.ceil(blocks / (a["sms"] * TILED_BOUNDS[1]))
    merge = 2 + math.ceil(splits / SPLITS_AT_ONCE) if splits > 1 else 0  # fence, count, partials
    moved = (weight_bytes * cols * width * row_tiles + 4 * rows * width * col_tiles
             + 4 * rows * cols * (1 + (2 * splits if splits > 1 else 0)))
    loads = blocks * slices * (threads // 32) * GPU_DEPTH * 2 * GPU_PATCH  # a's and b's a k
    return KernelCost(name, per_step, moved, blocks, threads, 1 + slices + merge,
                      waves * (2 * slices + 2 * (splits > 1)), TILED_BOUNDS[1], loads)


def _products(hidden, layers, heads, kv_heads, head_dim, intermediate, rows, weight_bytes):
    """A layer's products over `rows` rows as the backend launches them past the GEMVs'
    rows, for a float (or Q8_0, Q4_x) matrix: q, k and v as one tiled product over
    their rows side by side, o, gate and up as one (SiLU on its outputs), down."""
    from ..tiled_matmul import GPU_TILE, gate_up_columns
    q, kv = heads * head_dim, kv_heads * head_dim
    return [tiled_product(name, layers, rows, cols, width, weight_bytes)
            for name, cols, width in (
                ("tiled qkv", q + 2 * kv, hidden), ("tiled o_proj", hidden, q),
                ("tiled gate_up_silu", gate_up_columns(intermediate, GPU_TILE), hidden),
                ("tiled down_proj", hidden, intermediate))]


def decode_step(hidden, layers, heads, kv_heads, head_dim, intermediate, vocab,
                batch=1, context=64, weight_bytes=2, kinds=None):
    """The kernels of one batch-`batch` decode step of a Llama-shaped model at
    `context` keys, as this backend's design launches them (float weights of
    weight_bytes each, or packed ones: kinds, a PACKED scheme; float32 KV pool and
    activations): the GEMVs up to GEMV_MAX_ROWS rows, the tiled products past them."""
    from ..attention import (DECODE_BLOCKS_PER_SM, GPU_CHUNK, LANES_PER_KEY, MIN_DECODE_CHUNKS,
                             decode_block_cost, decode_split)
    from ..memory import covering_keys
    from ..elementwise import GPU_NORM_THREADS as NORM_THREADS  # (not the simulator's)
    from ..matmul import FLOAT_VEC, GEMV_BOUNDS, GEMV_MAX_ROWS, GEMV_THREADS, NORMED_MAX_ROWS, pairs_rows
    per_sm = GEMV_BOUNDS[1]  # (their registers: 8 blocks an SM, not the 16 threads allow)
    folded = batch <= NORMED_MAX_ROWS and kinds is None  # (float GEMVs take the norms)
    norm_syncs = 1 if folded else 0  # (the squares' butterfly beside the dots')

    def gemv_rounds(width):  # a thread's steps along a row (gate and up go together)
        return math.ceil(width / (GEMV_THREADS * FLOAT_VEC))

    def loop_waits(width):  # row_dots' 8-row loop: a step's later weights wait, from L1
        return gemv_rounds(width) * (FLOAT_VEC - 1)

    def rows_gemv(name, per_step, rows, width):  # past a wave's rows, two rows a block
        paired = pairs_rows(rows)  # (batch 1: the one-row forms, a round trip a step as well)
        kernel = (("one_row_paired" if paired else "one_row") if batch == 1 else
                  ("paired_rows" if paired else "rows"))
        return KernelCost(f"gemv_{kernel} ({name})", per_step,
                          weight_bytes * rows * width, -(-rows // 2) if paired else rows, GEMV_THREADS,
                          gemv_rounds(width), 3 if paired else 2, per_sm,
                          l1_waits=0 if batch == 1 else loop_waits(width))  # (one row: hoisted)

    # the decode attention's split as the backend picks it on a GPU (GPU_CHUNK-key
    # chunks, DECODE_BLOCKS_PER_SM blocks an SM: their registers), each block's chunks
    # one after another
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
        # the final norm; a layer's two where no GEMV folds them (normed_rows.py)
        KernelCost("add_rms_norm", 1 if folded else 2 * layers + 1, 3 * act * hidden, batch, NORM_THREADS,
                   1 if hidden <= NORM_THREADS else 2, 3),
        KernelCost("rope_write_kv", layers, act * 2 * (heads + 2 * kv_heads) * head_dim,
                   batch * (heads + kv_heads), head_dim // 2, 2, 0),
        # the row's position, then its first block id (2 round trips); a chunk: K/V (the
        # next chunk's block id in flight meanwhile); key shuffles, barrier, softmax
        # butterflies, barrier, the weighted sum from shared memory, barrier; the last
        # block's merge where there are partitions
        KernelCost("paged_attention_decode", layers, kv_bytes + (parts > 1) * partials,
                   batch * kv_heads * parts, GPU_CHUNK * LANES_PER_KEY, *decode_block_cost(chunks, parts),
                   per_sm=DECODE_BLOCKS_PER_SM),
        KernelCost("argmax (top_candidates)", 1, act * vocab, batch, 256, 2, 4),
    ]
    if kinds is not None:  # (the tiled products priced by the bytes of a weight)
        weight_bytes = KINDS[kinds["gate_up"]].block_bytes / KINDS[kinds["gate_up"]].block
    if batch > GEMV_MAX_ROWS:
        return kernels + _products(hidden, layers, heads, kv_heads, head_dim, intermediate, batch,
                                   weight_bytes) + [
            tiled_product("tiled lm_head", 1, batch, vocab, hidden, weight_bytes)]
    if kinds is not None:
        return kernels + _packed_gemvs(hidden, layers, heads, kv_heads, head_dim, intermediate, vocab,
                                       kinds, batch == 1)
    return kernels + [
        KernelCost("gemv_qkv", layers, weight_bytes * hidden * (heads + 2 * kv_heads) * head_dim,
                   (heads + 2 * kv_heads) * head_dim, GEMV_THREADS, gemv_rounds(hidden), 2 + norm_syncs, per_sm,
                   l1_waits=loop_waits(hidden)),
        rows_gemv("o_proj", layers, hidden, heads * head_dim),
        KernelCost("gemv_gate_up_silu", layers, 2 * weight_bytes * hidden * intermediate,
                   intermediate, GEMV_THREADS, gemv_rounds(hidden), 4 + norm_syncs, per_sm,
                   l1_waits=loop_waits(hidden)),
        rows_gemv("down_proj", layers, hidden, intermediate),
        rows_gemv("lm_head", 1, vocab, hidden),
    ]


def _packed_gemv(name, per_step, kind, rows, width, matrices=1, fused=False, one_row=False) -> KernelCost:
    """A packed GEMV (packed_matmul.decode_kernel_family) of `matrices` matrices of
    (rows, width) in `kind`: a block a row, each thread VEC bytes of nibbles (4 words
    of Q8_0) a step, the matrices' rows in the same pass (gate and up; one after the
    other for kquant_matmul's kinds that spilled so), each summed across
    the block (a butterfly and a shared-memory pass); a product of one matrix (not
    `fused`: q|k|v's launch) past a wave's rows two rows a block where the kind has that
    kernel (lm_head: half the blocks, both rows' sums). one_row: the kind's one-row
    family's kernel (batch 1: q|k|v fused, gate/up and pairs where they fit)."""
    from ..device_weights import GEMV_PAIRED, PACKED_KERNELS, decode_gemv
    from ..kquant_matmul import GATE_UP_IN_TWO_PASSES
    from ..matmul import GEMV_BOUNDS, GEMV_THREADS, VEC, pairs_rows
    k = KINDS[kind]
    per_step_bytes = 4 * GEMV_THREADS if k.name == "Q8_0" else 2 * VEC * GEMV_THREADS  # weights a step
    passes = matrices if kind in GATE_UP_IN_TWO_PASSES and not one_row else 1
    paired = (not fused and matrices == 1 and pairs_rows(rows)
              and decode_gemv(PACKED_KERNELS[kind], GEMV_PAIRED, 1 if one_row else 2) is not None)
    steps = passes * math.ceil(width / per_step_bytes)
    # (a nibble kind's 8-row step waits on each of its VEC quant bytes and its x; Q8_0's
    # word is one load, and so is a one-row step's of one matrix, its x loaded with it;
    # beside a second matrix's loads its x still waits a value at a time: bench/sass.py)
    hoisted = one_row and matrices == 1 and not paired
    waits = 0 if k.name == "Q8_0" or hoisted else steps * (VEC - 1)
    return KernelCost(f"{name}{' (paired)' if paired else ''}", per_step,
                      matrices * rows * width * k.block_bytes // k.block, -(-rows // 2) if paired else rows,
                      GEMV_THREADS, steps, 2 * (2 if paired else matrices), GEMV_BOUNDS[1], l1_waits=waits)


def _packed_gemvs(hidden, layers, heads, kv_heads, head_dim, intermediate, vocab, kinds, one_row) -> list:
    """A decode step's GEMVs with packed matrices of `kinds` (a PACKED scheme): q|k|v
    in one launch where the kind has a fused kernel (every kind for one row of x; Q8_0
    and Q4_x for more), else three."""
    from ..device_weights import GEMV_QKV, PACKED_KERNELS, decode_gemv
    q, kv = heads * head_dim, kv_heads * head_dim
    qkv = ([_packed_gemv("packed qkv", layers, kinds["qkv"], q + 2 * kv, hidden, fused=True, one_row=one_row)]
           if decode_gemv(PACKED_KERNELS[kinds["qkv"]], GEMV_QKV, 1 if one_row else 2) is not None else
           [_packed_gemv(f"packed {n}_proj", layers, kinds["qkv"], rows, hidden)
            for n, rows in (("q", q), ("k", kv), ("v", kv))])
    return qkv + [
        _packed_gemv("packed o_proj", layers, kinds["o_proj"], hidden, q, one_row=one_row),
        _packed_gemv("packed gate_up_silu", layers, kinds["gate_up"], intermediate, hidden, 2, one_row=one_row),
        _packed_gemv("packed down_proj", layers, kinds["down_proj"], hidden, intermediate, one_row=one_row),
        _packed_gemv("packed lm_head", 1, kinds["lm_head"], vocab, hidden, one_row=one_row)]


def prefill_step(hidden, layers, heads, kv_heads, head_dim, intermediate, vocab,
                 rows=512, before=0, weight_bytes=2):
    """The kernels of one prefill step of `rows` prompt tokens after `before` tokens of
    the same prompt (a chunk of a longer prompt: its keys are read from the pool):
    the tiled products, the tiled prefill attention, the row-wise kernels, and the
    prompt's last row's logits (a GEMV)."""
    from ..elementwise import GPU_NORM_THREADS as NORM_THREADS
    from ..matmul import FLOAT_VEC, GEMV_BOUNDS, GEMV_THREADS, pairs_rows
    from ..prefill_attention import (GPU_KEY_LANES, GPU_KV_TILES, GPU_PREFILL_THREADS, GPU_Q_TILE,
                                     PREFILL_BLOCKS_PER_SM)
    act = 4 * rows
    paired = pairs_rows(vocab)  # (the last row's logits: DeviceFloat.product's GEMV for one row)
    # a tile of GPU_Q_TILE query rows walks its keys a key tile at a time: on average the
    # chunk's earlier keys and half its own. A key tile: K and V (their block id read
    # during the tile before: one round trip), 3 barriers and 2 butterflies; shared
    # loads of a thread: q's 4 rows and its keys at every d, then p's 4 rows and its
    # dimensions at every key
    kv_tile = GPU_KV_TILES[min(w for w in GPU_KV_TILES if w >= head_dim)]
    rows_a_thread = GPU_Q_TILE * GPU_KEY_LANES // GPU_PREFILL_THREADS
    thread_loads = (head_dim * (rows_a_thread + kv_tile // GPU_KEY_LANES)
                    + kv_tile * (rows_a_thread + math.ceil(head_dim / GPU_KEY_LANES)))
    blocks = math.ceil(rows / GPU_Q_TILE) * heads
    key_tiles = math.ceil((before + (rows + GPU_Q_TILE) / 2) / kv_tile)
    waves = math.ceil(blocks / (ASSUMPTIONS["sms"] * PREFILL_BLOCKS_PER_SM))
    attention = KernelCost("paged_attention_prefill", layers,
                           blocks * key_tiles * kv_tile * head_dim * 2 * 4 + 2 * act * heads * head_dim,
                           blocks, GPU_PREFILL_THREADS, 2 + key_tiles, waves * key_tiles * 5,
                           PREFILL_BLOCKS_PER_SM,
                           blocks * key_tiles * GPU_PREFILL_THREADS // 32 * thread_loads)
    return [
        KernelCost("gather_rows", 1, act * hidden + weight_bytes * rows * hidden, rows, 32, 1, 0),
        KernelCost("add_rms_norm", 2 * layers, 3 * act * hidden, rows, NORM_THREADS, 1, 3),
        KernelCost("rope_write_kv", layers, act * 2 * (heads + 2 * kv_heads) * head_dim,
                   rows * (heads + kv_heads), head_dim // 2, 2, 0),
        attention,
        *_products(hidden, layers, heads, kv_heads, head_dim, intermediate, rows, weight_bytes),
        # the last row: gathered (hidden, residual), its final norm, lm_head, the argmax
        KernelCost("gather_rows (last row)", 2, 8 * hidden, 1, 32, 1, 0),
        KernelCost("add_rms_norm (last row)", 1, 12 * hidden, 1, NORM_THREADS, 1, 3),
        KernelCost(f"gemv_one_row{'_paired' if paired else ''} (lm_head)", 1, weight_bytes * vocab * hidden,
                   -(-vocab // 2) if paired else vocab, GEMV_THREADS,
                   math.ceil(hidden / (GEMV_THREADS * FLOAT_VEC)), 3 if paired else 2, GEMV_BOUNDS[1]),
        KernelCost("argmax (top_candidates)", 1, 4 * vocab, 1, 256, 2, 4),
    ]


def prefill_prompt(shape: dict, prompt=2048, chunk=512, weight_bytes=2, a=ASSUMPTIONS) -> dict:
    """A prompt of `prompt` tokens prefilled `chunk` tokens a step (the engine's
    max_num_batched_tokens): each step's prediction, their sum, tokens/s."""
    steps = [predict(prefill_step(**shape, rows=min(chunk, prompt - start), before=start,
                                  weight_bytes=weight_bytes), a)
             for start in range(0, prompt, chunk)]
    total = sum(s["step_us"] for s in steps)
    return {"steps": steps, "prompt_us": total, "tokens_per_s": prompt * 1e6 / total}


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

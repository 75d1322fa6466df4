"""Packed weights laid out 16 rows to a group at load (kernels/cpu/lanes.py): the
same weights as the PackedWeight they came from, and products with the bit
oracle's bits (packed_oracle.py) for every row, whatever the batch, on fresh random
blocks (the full byte range, zero scales, rows not a multiple of 16)."""
import os
import subprocess
import sys

import numpy as np
import pytest
from packed_oracle import oracle_product
from test_quantized import packed_product_bound, random_activations

from tinypaged.kernels import reference
from tinypaged.kernels.cpu import embedding, linear, stack_layer_matrices
from tinypaged.kernels.cpu.byte_dot import LANES_ISA
from tinypaged.kernels.cpu.lane_packed import LanePacked, lay_out_weights
from tinypaged.kernels.cpu.stack_rows import StackRows
from tinypaged.formats.quant_kind import Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0
from tinypaged.formats.packed import PackedWeight

KINDS = {"Q8_0": Q8_0, "Q4_0": Q4_0, "Q4_1": Q4_1, "Q5_0": Q5_0, "Q5_1": Q5_1, "Q4_K": Q4_K,
         "Q5_K": Q5_K, "Q6_K": Q6_K}
SUPER_BLOCKS = {Q4_K: 144, Q5_K: 176, Q6_K: 210}  # bytes of 256 weights


def width_for(kind: str, width: int) -> int:
    """width, or for the K-quants the next multiple of their 256-weight super-blocks."""
    return -(-width // 256) * 256 if KINDS[kind] in SUPER_BLOCKS else width


def random_packed(rng, ggml_type: int, n: int, k: int) -> PackedWeight:
    """An (n, k) matrix of random GGUF blocks: any quant bytes (and fifth bits), random
    float16 scales (and mins), one block with a zero scale."""
    per_block, size = (256, SUPER_BLOCKS[ggml_type]) if ggml_type in SUPER_BLOCKS else \
        (32, {Q8_0: 34, Q4_0: 18, Q4_1: 20, Q5_0: 22, Q5_1: 24}[ggml_type])
    blocks = rng.integers(0, 256, (n * k // per_block, size), dtype=np.uint8)
    d = (rng.standard_normal(len(blocks)) * 0.02).astype(np.float16)
    d[0] = 0
    at = size - 2 if ggml_type == Q6_K else 0  # (Q6_K's d is last)
    blocks[:, at:at + 2] = d.view(np.uint8).reshape(-1, 2)
    if ggml_type in (Q4_1, Q5_1, Q4_K, Q5_K):  # mins, or the K-quants' dmin
        blocks[:, 2:4] = (rng.standard_normal(len(blocks)) * 0.1).astype(np.float16) \
            .view(np.uint8).reshape(-1, 2)
    return PackedWeight.from_bytes(blocks.reshape(-1), ggml_type, (n, k))


@pytest.mark.parametrize("kind", KINDS)
def test_laid_out_weights_are_the_packed_weights(kind):
    rng = np.random.default_rng(31)
    weight = random_packed(rng, KINDS[kind], 50, width_for(kind, 128))
    laid = LanePacked.of(weight)
    assert np.array_equal(laid.dequantize(), weight.dequantize())
    rows = np.array([49, 0, 17, 16])
    assert np.array_equal(laid.dequantize(rows), weight.dequantize(rows))
    assert laid.shape == weight.shape and laid.kind.name == kind
    assert laid.nbytes == weight.nbytes * 64 // 50  # 4 groups: 14 rows of zeros after the 50


@pytest.mark.parametrize("kind", ["Q8_0", "Q5_1", "Q6_K"])
def test_laying_out_in_place_moves_the_bytes_within_their_own_memory(kind):
    rng = np.random.default_rng(35)
    weight = random_packed(rng, KINDS[kind], 48 * 16, width_for(kind, 64))
    copied = LanePacked.of(weight)
    source = weight.take_rows(np.arange(48 * 16))  # (its own arrays)
    moved = LanePacked.of(source, in_place=True)
    assert np.shares_memory(moved.quants, source.quants)
    for name in ("quants", "scales", "mins", "fifths"):
        a, b = getattr(copied, name), getattr(moved, name)
        assert (a is None and b is None) or np.array_equal(a, b), name
    uneven = weight.take_rows(np.arange(50))  # 50 rows: the last group is padded, a copy
    assert not np.shares_memory(LanePacked.of(uneven, in_place=True).quants, uneven.quants)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n_out, width", [(50, 64), (16, 576), (333, 640), (5, 64)])
def test_every_batch_gives_a_row_the_oracles_bits(kind, n_out, width):
    rng = np.random.default_rng(32 + n_out)
    width = width_for(kind, width)
    weight = random_packed(rng, KINDS[kind], n_out, width)
    laid = LanePacked.of(weight)
    w = weight.dequantize().astype(np.float64)
    for rows in (1, 2, 3, 8, 9, 33):  # the GEMV (up to 2), then the GEMM's passes: 4; 8; 8 + 4 (12);
        # 16 + 16 + 4, or 12 + 12 + 12 (widest_pass)
        x = random_activations(rng, rows, width)
        got = linear(x, laid)
        assert np.array_equal(got, oracle_product(x, weight))
        rounded = reference.round_activations(x).astype(np.float64)
        assert (np.abs(got - rounded @ w.T) <= packed_product_bound(rounded, w)).all()
        assert np.array_equal(linear(x[-1:], laid)[0], got[-1])  # alone as in the batch
        ahead = rng.integers(0, 256, 3000 + 640 * rows, dtype=np.uint8)  # (hinted, never read into a value)
        assert np.array_equal(linear(x, laid, ahead=ahead), got)


def _layer(rng) -> dict:
    """One layer's matrices (q/k/v and gate/up stack) and a tied embedding / lm_head,
    with a Q6_K matrix and a matrix of under 16 rows (one padded group)."""
    embed = random_packed(rng, Q8_0, 40, 64)
    return {"model.embed_tokens.weight": embed, "lm_head.weight": embed,
            "model.layers.0.self_attn.q_proj.weight": random_packed(rng, Q4_1, 64, 64),
            "model.layers.0.self_attn.k_proj.weight": random_packed(rng, Q4_1, 32, 64),
            "model.layers.0.self_attn.v_proj.weight": random_packed(rng, Q4_1, 32, 64),
            "model.layers.0.mlp.gate_proj.weight": random_packed(rng, Q5_0, 96, 64),
            "model.layers.0.mlp.up_proj.weight": random_packed(rng, Q5_0, 96, 64),
            "model.layers.0.mlp.down_proj.weight": random_packed(rng, Q6_K, 64, 256),
            "model.layers.0.self_attn.o_proj.weight": random_packed(rng, Q4_0, 8, 64)}


def test_lay_out_weights_replaces_every_name_that_held_a_matrix():
    rng = np.random.default_rng(33)
    before = stack_layer_matrices(_layer(rng))
    unique_bytes = lambda ws: sum(w.nbytes for w in {id(w): w for w in ws.values()}.values())  # noqa: E731
    bytes_before = unique_bytes(before)
    want = {name: (w.dequantize(), w.kind.name) for name, w in before.items()}
    xs = {k: random_activations(rng, 3, k) for k in (64, 256)}
    own = {name: w.stack[0].take_rows(np.arange(*w.stack[1:])) if isinstance(w, StackRows) else w
           for name, w in before.items()}  # (a stack's rows as a matrix of their own)
    products = {name: oracle_product(xs[w.shape[1]], w) for name, w in own.items()}
    after = lay_out_weights(dict(before))
    kinds = {name: type(w).__name__ for name, w in after.items()}
    assert kinds["model.embed_tokens.weight"] == "LanePacked"
    assert after["lm_head.weight"] is after["model.embed_tokens.weight"]  # still tied: one copy
    assert {kinds[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"} == {"StackRows"}
    stacks = {id(after[f"model.layers.0.self_attn.{p}_proj.weight"].stack[0]) for p in "qkv"}
    assert len(stacks) == 1  # the three views of one laid-out stack
    assert {kinds[f"model.layers.0.mlp.{p}_proj.weight"] for p in ("gate", "up")} == {"StackRows"}
    assert kinds["model.layers.0.mlp.down_proj.weight"] == "LanePacked"  # Q6_K, alone
    assert kinds["model.layers.0.self_attn.o_proj.weight"] == "LanePacked"  # 8 rows: one group
    for name, w in after.items():
        assert np.array_equal(w.dequantize(), want[name][0]), name
        assert w.kind.name == want[name][1]
        assert np.array_equal(linear(xs[w.shape[1]], w), products[name]), name
    # + the embedding's 8 padded rows (Q8_0, 2 blocks of 34 bytes) and o_proj's (Q4_0, 18)
    assert unique_bytes(after) == bytes_before + 8 * 2 * 34 + 8 * 2 * 18
    tokens = np.array([3, 39, 0])
    assert np.array_equal(embedding(tokens, after["model.embed_tokens.weight"]),
                          want["model.embed_tokens.weight"][0][tokens])


def test_q_and_k_stack_where_v_has_a_kind_of_its_own():
    """Q4_K_M gives a third of the layers a Q6_K v: q and k still make one product (and
    gate/up one, its halves read in place by silu or gelu), with every row's bits its own."""
    from tinypaged.kernels import cpu
    rng = np.random.default_rng(36)
    layer = "model.layers.0."
    parts = {"self_attn.q_proj": (Q4_K, 64), "self_attn.k_proj": (Q4_K, 32), "self_attn.v_proj": (Q6_K, 32),
             "mlp.gate_proj": (Q8_0, 96), "mlp.up_proj": (Q8_0, 96)}
    weights = {layer + name + ".weight": random_packed(rng, kind, n, 256) for name, (kind, n) in parts.items()}
    x = random_activations(rng, 5, 256)
    want = {name: oracle_product(x, w) for name, w in weights.items()}
    prepared = cpu.prepare_weights(dict(weights))
    q, k, v = (prepared[layer + f"self_attn.{p}_proj.weight"] for p in "qkv")
    assert isinstance(q, StackRows) and q.stack[0] is k.stack[0] and isinstance(v, LanePacked)
    for got, p in zip(cpu.qkv_proj(x, q, k, v), "qkv"):
        assert np.array_equal(got, want[layer + f"self_attn.{p}_proj.weight"]), p
    gate, up = (prepared[layer + f"mlp.{p}_proj.weight"] for p in ("gate", "up"))
    assert gate.stack[0] is up.stack[0]
    assert np.array_equal(cpu.gate_up_silu(x, gate, up), cpu.silu_mul(want[layer + "mlp.gate_proj.weight"],
                                                                       want[layer + "mlp.up_proj.weight"]))
    assert np.array_equal(cpu.gate_up_gelu(x, gate, up), cpu.gelu_tanh_mul(want[layer + "mlp.gate_proj.weight"],
                                                                           want[layer + "mlp.up_proj.weight"]))


ISA_CHECK = """
import sys
import numpy as np
from tinypaged.formats.packed import PackedWeight
from tinypaged.kernels.cpu.byte_dot import LANES_ISA
from tinypaged.kernels.cpu.lane_packed import LanePacked
from tinypaged.kernels.cpu.linear import linear
for path in sys.argv[1:]:
    data = np.load(path)
    arrays = [data[n] if n in data else None for n in ("quants", "scales", "mins", "supers", "highs")]
    laid = LanePacked.of(PackedWeight(int(data["kind"]), tuple(data["shape"]), *arrays))
    for rows in ROWS:
        assert np.array_equal(linear(data[f"x{rows}"], laid), data[f"out{rows}"]), (path, rows)
print(LANES_ISA)
"""
ROWS = (1, 3, 9, 17, 33)  # the GEMV; the GEMM's passes: 4; 8 + 4; 16 + 4 (AVX2 halves: 12 + 8); 16 + 16 + 4
# an instruction set this CPU can run but does not choose, numba compiling for a CPU it names
OTHER_ISAS = {"generic": ({"NUMBA_CPU_NAME": "x86-64"}, ("Q5_K",)),
              "avx2": ({"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "+avx2,+fma,+f16c"},
                       ("Q8_0", "Q4_K", "Q5_1", "Q6_K"))}


@pytest.mark.parametrize("isa", OTHER_ISAS)
def test_every_instruction_set_gives_this_cpus_bits(isa, tmp_path):
    """The byte dot and the passes of another instruction set (byte_dot.py: AVX2's
    vpmaddubsw, or plain LLVM vectors for a CPU without AVX2), compiled by numba for a
    CPU it names, give this CPU's bits: the GEMV and the GEMM's every pass. Q8_0's signed
    bytes, AVX2's halves of a group (Q4_K), Q5's and Q6_K's high bits in bytes."""
    if isa == LANES_ISA or (isa == "avx2" and LANES_ISA == "generic"):
        pytest.skip(f"this CPU runs {LANES_ISA} in every test and cannot run {isa} beside it")
    env, kinds = OTHER_ISAS[isa]
    rng = np.random.default_rng(35)
    cases = []
    for kind in kinds:
        weight = random_packed(rng, KINDS[kind], 24, 512)
        data = {"kind": KINDS[kind], "shape": np.array(weight.shape)}
        data.update({n: getattr(weight, n) for n in ("quants", "scales", "mins", "supers", "highs")
                     if getattr(weight, n) is not None})
        for rows in ROWS:
            data[f"x{rows}"] = random_activations(rng, rows, 512)
            data[f"out{rows}"] = linear(data[f"x{rows}"], LanePacked.of(weight))
        np.savez(tmp_path / f"{kind}.npz", **data)
        cases.append(str(tmp_path / f"{kind}.npz"))
    done = subprocess.run([sys.executable, "-c", ISA_CHECK.replace("ROWS", repr(ROWS))] + cases,
                          capture_output=True, text=True, timeout=900, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [isa]

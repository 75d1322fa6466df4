"""K-quants (Q4_K, Q5_K, Q6_K), as most GGUF files on the hub hold them: our NumPy
dequantizer against llama.cpp's own Python package (`gguf`, tests only), and a
model with K-quant matrices loaded directly and kept packed."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

import gguf_writer as gw
from test_gguf_convert import write_tiny_llama_gguf
from tinypaged import LLM, SamplingParams
from tinypaged.formats.quant_kind import Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0
from tinypaged.formats.ggml_quant import dequantize
from tinypaged.model.gguf_model import load_gguf_model
from tinypaged.formats.packed import PackedWeight

TYPES = {"Q4_K": (Q4_K, GGMLQuantizationType.Q4_K, 144, [0, 2]),
         "Q5_K": (Q5_K, GGMLQuantizationType.Q5_K, 176, [0, 2]),
         "Q6_K": (Q6_K, GGMLQuantizationType.Q6_K, 210, [208])}


def random_blocks(rng, n, block_bytes, scale_offsets):
    """n super-blocks of random bits, with finite float16 super-block scales."""
    raw = rng.integers(0, 256, (n, block_bytes), dtype=np.uint8)
    for offset in scale_offsets:
        scale = (rng.standard_normal(n) * rng.choice([1e-3, 0.05, 1.0])).astype(np.float16)
        raw[:, offset:offset + 2] = scale.view(np.uint8).reshape(n, 2)
    return raw


@pytest.mark.parametrize("name, ours, theirs, block_bytes", [
    ("Q5_0", Q5_0, GGMLQuantizationType.Q5_0, 22), ("Q5_1", Q5_1, GGMLQuantizationType.Q5_1, 24)])
def test_q5_dequantizes_as_llama_cpp_does_bit_for_bit(name, ours, theirs, block_bytes):
    rng = np.random.default_rng(block_bytes)
    for _ in range(5):
        raw = rng.integers(0, 256, (40, block_bytes), dtype=np.uint8)
        for offset in ((0,) if ours == Q5_0 else (0, 2)):  # finite float16 d (and m)
            raw[:, offset:offset + 2] = (rng.standard_normal((40, 1)) * rng.choice([1e-3, 1.0])
                                         ).astype(np.float16).view(np.uint8)
        expected = quants.dequantize(raw, theirs).reshape(-1)
        assert np.array_equal(dequantize(raw.reshape(-1), ours, (40 * 32,), name), expected)


@pytest.mark.parametrize("name", TYPES)
def test_dequantizing_equals_llama_cpp_bit_for_bit(name):
    ours, theirs, block_bytes, scale_offsets = TYPES[name]
    rng = np.random.default_rng(block_bytes)
    for _ in range(5):
        raw = random_blocks(rng, 40, block_bytes, scale_offsets)
        expected = quants.dequantize(raw, theirs).reshape(-1)
        got = dequantize(raw.reshape(-1), ours, (40 * 256,), name)
        assert np.array_equal(got, expected)


def _greedy_equal_on_cpu_and_reference(path) -> None:
    """The CPU's greedy tokens equal the reference backend's, and a batch of four (its
    decode steps through the group GEMM, not the GEMV) gives the first prompt the same."""
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    cpu = LLM(path, backend="cpu")
    got = cpu.generate([[5, 9, 40]], greedy)[0].outputs[0].token_ids
    want = LLM(path, backend="reference").generate([[5, 9, 40]], greedy)[0].outputs[0].token_ids
    assert got == want and len(got) == 6
    batch = cpu.generate([[5, 9, 40], [7, 1], [3, 3, 3, 3], [11, 2, 8]], greedy)
    assert batch[0].outputs[0].token_ids == got


PACKED = {"Q4_K": Q4_K, "Q5_K": Q5_K, "Q6_K": Q6_K, "Q5_0": Q5_0, "Q5_1": Q5_1}


@pytest.mark.parametrize("name", PACKED)
def test_a_packed_kind_stays_packed_with_the_files_values_and_runs(tmp_path, name):
    path = tmp_path / f"{name}.gguf"
    _, weights = write_tiny_llama_gguf(path, ffn_up_type=gw.RAW_TYPES[name], hidden=256,
                                       intermediate=256)
    cfg, loaded = load_gguf_model(path)
    up = loaded["model.layers.0.mlp.up_proj.weight"]
    kind = PACKED[name]
    assert isinstance(up, PackedWeight) and up.ggml_type == kind
    assert (up.supers is not None) == name.endswith("_K") and (up.highs is not None) == (kind != Q4_K)
    assert np.array_equal(up.dequantize(), weights["model.layers.0.mlp.up_proj.weight"])
    _greedy_equal_on_cpu_and_reference(path)
    assert LLM(path, backend="cpu").stats()["requantized"] == {}


@pytest.mark.parametrize("name", ["Q5_0", "Q5_1"])
def test_a_q5_matrix_of_an_odd_number_of_blocks_is_requantized_to_q8_0_and_runs(tmp_path, name):
    """(Q5_x keeps its rows packed when they pair blocks, as Q4_x's nibbles do; 96
    columns are three blocks.)"""
    path = tmp_path / f"{name}.gguf"
    _, weights = write_tiny_llama_gguf(path, ffn_up_type=gw.RAW_TYPES[name], hidden=96,
                                       intermediate=64)
    cfg, loaded = load_gguf_model(path)
    up = loaded["model.layers.0.mlp.up_proj.weight"]
    assert isinstance(up, PackedWeight) and up.ggml_type == Q8_0
    on_file = weights["model.layers.0.mlp.up_proj.weight"]  # llama.cpp's decoding
    step = np.abs(on_file).reshape(-1, 32).max(1) / 127  # Q8_0's rounding step per block
    # half a step, plus 127 times the float16 rounding of the step (absolute 2^-25 when
    # the step is a float16 subnormal, below 2^-14)
    scale_error = np.maximum(step * 2.0 ** -11, 2.0 ** -25)
    error = np.abs(up.dequantize() - on_file).reshape(-1, 32)
    assert (error <= (step * 0.5 + 127 * scale_error)[:, None] + 1e-9).all() and error.max() > 0
    _greedy_equal_on_cpu_and_reference(path)
    stats = LLM(path, backend="cpu").stats()  # each layer's up_proj, named with the file's kind
    assert stats["requantized"] == {f"model.layers.{i}.mlp.up_proj.weight": f"{name} -> Q8_0"
                                    for i in range(2)}


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["Q6_K"])
def test_the_cuda_backend_reads_the_packed_blocks_and_runs(tmp_path, name):
    """The upload keeps the file's kind (kquant_matmul.py reads the blocks; nothing is
    requantized), and greedy tokens equal the reference's. This file packs up_proj
    and not gate_proj, so the fused gate/up kernel gives way to two products. (Every
    kind's kernels are held to the reference in test_cuda_kernels.py; this is the one
    furthest from Q4_x in a whole model, on the simulator.)"""
    from tinypaged.kernels.cuda.device_weights import DevicePacked
    path = tmp_path / f"{name}.gguf"
    write_tiny_llama_gguf(path, ffn_up_type=gw.RAW_TYPES[name], hidden=256, intermediate=256)
    llm = LLM(path, backend="cuda", num_blocks=8)
    up = llm.engine.runner.model.w["model.layers.0.mlp.up_proj.weight"]
    assert isinstance(up, DevicePacked) and up.kind.name == name
    greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)  # a prefill, a decode
    got = llm.generate([[5, 9, 40]], greedy)[0].outputs[0].token_ids
    want = LLM(path, backend="reference").generate([[5, 9, 40]], greedy)[0].outputs[0].token_ids
    assert got == want


LIES = {"its type Q6_K (longer blocks)": ("type", 14), "its type Q5_0 (shorter)": ("type", 6),
        "its type Q5_K": ("type", 13), "384 columns (not whole super-blocks)": ("columns", 384),
        "512 rows": ("rows", 512)}


@pytest.mark.parametrize("lie", LIES)
def test_a_k_quant_header_that_lies_is_one_clear_line(tmp_path, lie):
    """A Q4_K tensor whose header says another type or shape: the data would be read
    as something it is not (tensors overlap, or leave a gap), so the file is refused
    with one line that names it, as llama.cpp refuses it; never garbage logits."""
    path = tmp_path / "ok.gguf"
    write_tiny_llama_gguf(path, ffn_up_type=gw.RAW_TYPES["Q4_K"], hidden=256, intermediate=256)
    data = bytearray(path.read_bytes())
    name = b"blk.0.ffn_up.weight"
    dims_at = data.find(name) + len(name) + 4  # (after the name: n_dims u32, dims u64s, type u32)
    field, value = LIES[lie]
    at = {"columns": dims_at, "rows": dims_at + 8, "type": dims_at + 16}[field]
    data[at:at + (4 if field == "type" else 8)] = value.to_bytes(4 if field == "type" else 8, "little")
    broken = tmp_path / "lying.gguf"
    broken.write_bytes(bytes(data))
    with pytest.raises(ValueError) as refused:
        load_gguf_model(broken)
    message = str(refused.value)
    assert str(broken) in message and "blk.0.ffn_" in message and "\n" not in message
    if field == "type":
        assert "type or shape" in message

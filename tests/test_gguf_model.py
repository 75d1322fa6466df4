"""A GGUF file loaded directly (LLM("model.gguf")): config, tokenizer and weights from
the file, quantized matrices kept packed, the output the dense reference's."""
import numpy as np
import pytest

import gguf_writer as gw
from test_gguf_convert import write_tiny_llama_gguf
from tinypaged import LLM, SamplingParams
from tinypaged.model.gguf_model import load_gguf_model
from tinypaged.formats.packed import PackedWeight
from tinypaged.model.loading import load_model
from tinypaged.tokenizer import Tokenizer

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
TYPES = {"Q8_0": gw.GGML_Q8_0, "Q4_0": gw.GGML_Q4_0, "Q4_1": gw.GGML_Q4_1}


@pytest.fixture(params=list(TYPES))
def quantized_gguf(request, tmp_path):
    """A tiny Llama whose layer matrices are all of one quantized type (64 wide, so Q4
    rows pack), and the weights it decodes to."""
    path = tmp_path / f"tiny-{request.param}.gguf"
    cfg, weights = write_tiny_llama_gguf(path, ffn_up_type=TYPES[request.param],
                                         matrix_type=TYPES[request.param], hidden=64,
                                         intermediate=128)
    return path, request.param, weights


def test_quantized_matrices_stay_packed_and_decode_to_the_file_values(quantized_gguf):
    path, type_name, weights = quantized_gguf
    cfg, loaded = load_gguf_model(path)
    packed = {n: w for n, w in loaded.items() if isinstance(w, PackedWeight)}
    assert len(packed) == 7 * cfg.num_hidden_layers  # q k v o gate up down in every layer
    assert {w.kind.name for w in packed.values()} == {type_name}
    for name, want in weights.items():  # Q/K rows back in rotate-half order, exactly
        got = loaded[name].dequantize() if name in packed else loaded[name]
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_a_packed_matrix_read_in_slabs_is_the_matrix_read_whole(quantized_gguf, monkeypatch):
    """Loading reads a packed matrix a slab of rows at a time and releases each slab's
    file pages (the embedding's file pages and its copy were Gemma 3's peak at load):
    slabs of 3 rows, seams and a short last slab, give the same arrays."""
    from tinypaged.model import gguf_model
    from tinypaged.formats.gguf import GGUFFile
    path, _, _ = quantized_gguf
    gguf = GGUFFile(path)
    name = "blk.0.ffn_up.weight"
    info = gguf.tensors[name]
    whole = PackedWeight.from_bytes(np.array(gguf.raw(name)), info.ggml_type, info.shape)
    monkeypatch.setattr(gguf_model, "SLAB_BYTES", 3 * info.nbytes // info.shape[0])
    assert info.shape[0] % 3 != 0
    slabs = gguf_model._packed_in_slabs(gguf, name, info)
    for a, b in zip(slabs.arrays(), whole.arrays()):
        assert (a is None and b is None) or np.array_equal(a, b)
    assert slabs.ggml_type == whole.ggml_type and slabs.shape == whole.shape


def test_packed_generation_equals_the_dense_reference(quantized_gguf):
    path, _, _ = quantized_gguf
    prompts = [[5, 17, 99, 3], [200, 7], list(range(40, 70))]
    packed = LLM(path, backend="cpu", block_size=4).generate(prompts, GREEDY)
    dense = LLM(path, backend="reference", block_size=4).generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in packed] == [o.outputs[0].token_ids for o in dense]
    batch_of_one = [LLM(path, backend="cpu").generate([p], GREEDY)[0] for p in prompts]
    assert [o.outputs[0].token_ids for o in batch_of_one] == [o.outputs[0].token_ids for o in dense]


def test_the_tokenizer_comes_from_the_file(tmp_path):
    write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    from tinypaged.model.gguf_convert import convert_gguf
    convert_gguf(tmp_path / "tiny.gguf", tmp_path / "folder")
    direct, converted = Tokenizer(tmp_path / "tiny.gguf"), Tokenizer(tmp_path / "folder")
    text = "hello 12 world"
    assert direct.encode(text) == converted.encode(text)
    assert direct.chat_template == converted.chat_template and direct.eos_token_id == converted.eos_token_id


def test_a_broken_gguf_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 8)
    with pytest.raises(ValueError, match="bad.gguf"):
        LLM(bad, backend="cpu")
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        load_model(tmp_path / "missing.gguf")


def test_weight_bytes_are_the_file_tensor_bytes(quantized_gguf):
    path, _, _ = quantized_gguf
    from tinypaged.formats.gguf import GGUFFile
    on_file = sum(info.nbytes for info in GGUFFile(path).tensors.values())
    assert LLM(path, backend="cpu").stats()["weight_bytes"] == on_file


@pytest.mark.parametrize("quantization", ["q8_0", "q4_0", "q4_1"])
def test_quantization_at_load_packs_a_float_model(stories_dir, quantization):
    prompts = ["Once upon a time", "The little dog"]
    packed = LLM(stories_dir, backend="cpu", quantization=quantization)
    kinds = [type(w).__name__ for w in packed.engine.runner.model.w.values()]
    held_packed = sum(kinds.count(k) for k in ("PackedWeight", "LanePacked", "StackRows"))  # (lanes.py)
    assert held_packed >= 5 * 6  # every matrix whose rows split into blocks
    dense = LLM(stories_dir, backend="reference", quantization=quantization)  # widened again
    got, want = packed.generate(prompts, GREEDY), dense.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    float_bytes = LLM(stories_dir, backend="cpu").stats()["weight_bytes"]
    assert packed.stats()["weight_bytes"] < float_bytes / 2

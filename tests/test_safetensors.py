import json
import os
import struct

import numpy as np
import pytest

from helpers import random_weights, tiny_config_dict, write_safetensors, write_tiny_model
from tinypaged.model.config import ModelConfig
from tinypaged.formats.safetensors_io import read_safetensors
from tinypaged.model.loading import load_model
from tinypaged.model.weights import load_weights


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_single_file_round_trip(tmp_path, dtype):
    expected = write_tiny_model(str(tmp_path), seed=1, dtype=dtype)
    cfg, weights = load_model(tmp_path)
    assert set(expected) <= set(weights)
    for name, want in expected.items():  # F16 matrices stay float16 (one copy, exact)
        kept = np.float16 if dtype == "F16" and want.ndim == 2 else np.float32
        assert weights[name].dtype == kept, name
        np.testing.assert_array_equal(weights[name], want, err_msg=name)


def test_dtypes_widen_within_their_precision(tmp_path):
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    for dtype, rtol in [("F32", 0), ("F16", 2 ** -11), ("BF16", 2 ** -8)]:
        write_safetensors(str(tmp_path / "t.safetensors"), {"x": x}, dtype)
        np.testing.assert_allclose(read_safetensors(tmp_path / "t.safetensors")["x"], x,
                                   rtol=rtol, atol=1e-30)


def test_tied_embeddings_share_the_embedding_matrix(tmp_path):
    write_tiny_model(str(tmp_path), tie_word_embeddings=True)
    cfg, weights = load_model(tmp_path)
    assert weights["lm_head.weight"] is weights["model.embed_tokens.weight"]


def test_sharded_folder_with_index(tmp_path):
    cfg = ModelConfig.from_dict(tiny_config_dict())
    weights = random_weights(cfg, seed=3)
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for shard, shard_names in shards.items():
        write_safetensors(str(tmp_path / shard), {n: weights[n] for n in shard_names}, "BF16")
        weight_map.update({n: shard for n in shard_names})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    loaded = load_weights(tmp_path, cfg)
    for name in names:
        np.testing.assert_allclose(loaded[name], weights[name], rtol=2 ** -8, atol=1e-30)


def test_missing_tensor_is_named(tmp_path):
    cfg = ModelConfig.from_dict(tiny_config_dict())
    weights = random_weights(cfg)
    del weights["model.layers.1.mlp.up_proj.weight"]
    write_safetensors(str(tmp_path / "model.safetensors"), weights)
    with pytest.raises(ValueError, match="'model.layers.1.mlp.up_proj.weight' is missing"):
        load_weights(tmp_path, cfg)


def test_misshapen_tensor_is_named_with_both_shapes(tmp_path):
    cfg = ModelConfig.from_dict(tiny_config_dict())
    weights = random_weights(cfg)
    weights["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 32), np.float32)
    write_safetensors(str(tmp_path / "model.safetensors"), weights)
    with pytest.raises(ValueError, match=r"k_proj.weight' has shape \[8, 32\], expected \[16, 32\]"):
        load_weights(tmp_path, cfg)


def test_truncated_and_corrupt_files(tmp_path):
    path = tmp_path / "model.safetensors"
    write_safetensors(str(path), {"x": np.ones((64, 64), np.float32)})
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(ValueError, match="truncated"):
        read_safetensors(path)
    path.write_bytes(data[:20])
    with pytest.raises(ValueError, match="header"):
        read_safetensors(path)
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="truncated"):
        read_safetensors(path)


def test_folder_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny_config_dict()))
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        load_model(tmp_path)
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        load_model(os.path.join(tmp_path, "nope"))


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_a_half_precision_model_runs_from_one_two_byte_copy(tmp_path, dtype):
    """F16 and BF16 checkpoints: every matrix held once at 2 bytes a weight on the CPU
    backend, greedy output equal to the dense reference's."""
    from helpers import dense_greedy
    from tinypaged import LLM, SamplingParams
    from tinypaged.model.reference import ReferenceModel

    expected = write_tiny_model(str(tmp_path), seed=4, dtype=dtype)
    llm = LLM(tmp_path, num_blocks=64)
    matrices = sum(w.size for w in expected.values() if w.ndim == 2)  # (untied lm_head included)
    vectors = sum(w.nbytes for w in expected.values() if w.ndim == 1)
    assert llm.stats()["weight_bytes"] == 2 * matrices + vectors
    prompt = [5, 17, 99, 3]
    got = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    oracle = ReferenceModel(*load_model(tmp_path))
    assert got[0].outputs[0].token_ids == dense_greedy(oracle, prompt, 12)


def raw_safetensors(path, header: dict, data: bytes) -> None:
    """A file with this header, written by hand (the library refuses to write bad ones)."""
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


@pytest.mark.parametrize("entries, data, message", [
    ({"a": ([2], [0, 8]), "b": ([2], [4, 12])}, 12, "'b' starts at byte 4 of the data, not at 8 "
                                                      "(overlapping the tensor before it)"),
    ({"a": ([2], [0, 8]), "b": ([2], [12, 20])}, 20, "'b' starts at byte 12 of the data, not at 8 (a gap)"),
    ({"a": ([2], [0, 8])}, 12, "the tensors end at byte 8 of the data, which holds 12"),
    ({"a": ([2], [0.0, 8.0])}, 8, "data_offsets [0.0, 8.0] must be two integers"),
    ({"a": ([2], [8, 0])}, 8, "must be two integers, begin <= end"),
    ({"a": ([2 ** 32, 2 ** 32], [0, 8])}, 8, "byte range 0..8 does not match shape [4294967296, 4294967296]"),
    ({"a": ([2.5], [0, 8])}, 8, "shape [2.5] must be a list of non-negative integers"),
    ({"a": ([-2], [0, 8])}, 8, "shape [-2] must be a list of non-negative integers"),
])
def test_a_header_is_checked_as_the_safetensors_library_checks_it(tmp_path, entries, data, message):
    path = tmp_path / "bad.safetensors"
    raw_safetensors(path, {name: {"dtype": "F32", "shape": shape, "data_offsets": offsets}
                           for name, (shape, offsets) in entries.items()}, bytes(data))
    with pytest.raises(ValueError) as e:
        read_safetensors(path)
    assert str(e.value).startswith(str(path)) and message in str(e.value), str(e.value)


def test_every_entry_is_checked_even_when_some_are_read(tmp_path):
    path = tmp_path / "bad.safetensors"
    raw_safetensors(path, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12))
    with pytest.raises(ValueError, match="overlapping"):
        read_safetensors(path, names={"a"})

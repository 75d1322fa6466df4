"""kv_cache_dtype="auto" (the default): the KV pool follows the checkpoint's precision,
float16 for GGUF files and float16 / bfloat16 folders, float32 for float32 ones; an
explicit choice always wins."""
import pytest

from helpers import tiny_config_dict, write_tiny_model
from test_gguf_convert import write_tiny_llama_gguf
from tinypaged import LLM, SamplingParams
from tinypaged.engine.kv_pool import kv_cache_dtype
from tinypaged.model.config import ModelConfig

POOL = 1 << 20  # bytes: the same memory for every engine below


@pytest.mark.parametrize("declared, read", [
    ({"dtype": "bfloat16"}, "bfloat16"), ({"torch_dtype": "float16"}, "float16"),
    ({"torch_dtype": "float32"}, "float32"), ({}, "float32"),
    ({"dtype": "float16", "torch_dtype": "float32"}, "float16"),  # the newer key first
    ({"torch_dtype": "int8"}, "float32"), ({"dtype": ["float16"]}, "float32")])
def test_the_checkpoint_precision_is_read_from_config_json(declared, read):
    assert ModelConfig.from_dict(tiny_config_dict(**declared)).dtype == read


@pytest.mark.parametrize("requested, checkpoint, taken", [
    ("auto", "float16", "float16"), ("auto", "bfloat16", "float16"),
    ("auto", "float32", "float32"), ("float32", "float16", "float32"),
    ("float16", "float32", "float16")])
def test_auto_is_resolved_from_the_checkpoint_and_a_choice_wins(requested, checkpoint, taken):
    assert kv_cache_dtype(requested, checkpoint) == taken


def _engine(path, **kwargs) -> LLM:
    return LLM(str(path), backend="cpu", block_size=4, kv_cache_memory=POOL, **kwargs)


def test_a_half_precision_folder_gets_twice_the_blocks_and_the_same_tokens(tmp_path):
    """The same weights declared float32 and bfloat16: the bfloat16 folder's pool is
    float16 (twice the blocks in the same memory), and greedy decoding of the tiny
    model gives the same tokens either way."""
    write_tiny_model(str(tmp_path / "wide"))
    write_tiny_model(str(tmp_path / "half"), torch_dtype="bfloat16")
    wide, half = _engine(tmp_path / "wide"), _engine(tmp_path / "half")
    forced = _engine(tmp_path / "half", kv_cache_dtype="float32")
    assert (wide.engine.kv_cache_dtype, half.engine.kv_cache_dtype,
            forced.engine.kv_cache_dtype) == ("float32", "float16", "float32")
    blocks = wide.engine.block_manager.num_blocks
    assert half.engine.block_manager.num_blocks == 2 * blocks
    assert forced.engine.block_manager.num_blocks == blocks
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompt = [[5, 9, 14, 3, 27, 8]]
    tokens = [e.generate(prompt, params)[0].outputs[0].token_ids for e in (wide, half)]
    assert tokens[0] == tokens[1] and len(tokens[0]) == 8


def test_a_gguf_file_gets_a_float16_pool_as_llama_cpp_gives_it(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(path)
    assert _engine(path).engine.kv_cache_dtype == "float16"
    assert _engine(path, kv_cache_dtype="float32").engine.kv_cache_dtype == "float32"

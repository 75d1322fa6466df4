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
    from tinypaged.kernels import cpu
    assert kv_cache_dtype(requested, checkpoint, 64, cpu) == taken


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


# -- kv_cache_dtype="int8": kernels/kv_q8.py's rows ------------------------------------

INT8_MODEL = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1)  # head_dim 32


def test_int8_rows_hold_each_block_of_32_within_half_a_step():
    """kv_q8's spec: q8_0's rounding, a float16 scale per 32 values, every value held
    within half a step of its block's, plus what the scale's rounding to float16 moves
    it (at most 127 times that rounding)."""
    import numpy as np

    from tinypaged.kernels.kv_q8 import dequantize_rows, quantize_rows, row_width
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 3, 64)).astype(np.float32) * np.float32(10.0) ** rng.integers(-3, 3, (5, 3, 1))
    x[0, 0, :32] = 0.0  # a block of zeros: scale 0, values 0
    rows = quantize_rows(x)
    assert rows.shape == (5, 3, row_width(64)) == (5, 3, 68) and rows.dtype == np.int8
    held = dequantize_rows(rows)
    step = np.abs(x.reshape(5, 3, 2, 32)).max(axis=-1, keepdims=True) / np.float32(127)
    stored = np.ascontiguousarray(rows[..., 64:]).view(np.float16).astype(np.float32)[..., None]
    bound = 0.5 * step + 127 * np.abs(stored - step) + 1e-7
    assert (np.abs(held - x).reshape(5, 3, 2, 32) <= bound).all()
    assert (held[0, 0, :32] == 0).all()


def test_int8_pool_holds_nearly_four_times_the_tokens_and_gives_the_references_tokens(tmp_path):
    """The same memory holds 128 / 34 times float32's blocks (head_dim 32: 32 values and 2
    bytes of scale a row); greedy decoding on the CPU's int8 pool equals the reference
    backend's on its own int8 pool, through prefix sharing and parallel samples'
    copy-on-write."""
    write_tiny_model(str(tmp_path), **INT8_MODEL)
    wide = _engine(tmp_path, kv_cache_dtype="float32")
    narrow = _engine(tmp_path, kv_cache_dtype="int8")
    assert narrow.engine.block_manager.num_blocks == wide.engine.block_manager.num_blocks * 128 // 34
    oracle = LLM(str(tmp_path), backend="reference", block_size=4, kv_cache_memory=POOL,
                 kv_cache_dtype="int8")
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    sampled = SamplingParams(temperature=0.9, seed=5, n=2, max_tokens=6, ignore_eos=True)
    shared = [5, 9, 14, 3, 27, 8, 40, 41, 42]  # two whole blocks of 4 shared by both prompts
    prompts = [shared + [7], shared + [11, 12]]
    for params in (greedy, sampled):
        got = [[c.token_ids for c in o.outputs] for o in narrow.generate(prompts, params)]
        want = [[c.token_ids for c in o.outputs] for o in oracle.generate(prompts, params)]
        assert got == want
    assert narrow.stats()["prefix_cache_hit_tokens"] > 0


def test_int8_is_refused_where_a_head_does_not_split_into_blocks_of_32(tmp_path):
    write_tiny_model(str(tmp_path))  # head_dim 8
    with pytest.raises(ValueError, match="head_dim=8 is not a multiple of 32: use float16"):
        _engine(tmp_path, kv_cache_dtype="int8")

"""What users actually pass the library: every mistake is named before any work starts,
and no failure or interrupt leaves a request or a block behind (issue 9's reproducers)."""
import math
import threading

import numpy as np
import pytest

from helpers import ctrl_c_while_waiting_for_output, step_gate
from tinypaged import LLM, SamplingParams
from tinypaged.config import EngineConfig
from tinypaged.outputs import KV_CACHE_FULL
from tinypaged.serve.openai_format import completion_choice

GREEDY = SamplingParams(temperature=0, max_tokens=8)
LONG = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
BYTE_E2 = 229  # stories260K's byte-fallback token <0xE2>: the first byte of a 3-byte character


@pytest.fixture(scope="module")
def llm(stories_dir):
    with LLM(stories_dir, backend="cpu", kv_cache_memory=8 << 20) as llm:
        yield llm


@pytest.fixture(scope="module")
def expected(llm):
    """The plain greedy answer every check compares against after a mistake."""
    return llm.generate("Once upon a time", GREEDY)[0].outputs[0].token_ids


def assert_whole(llm, expected=None):
    """No block in use, nothing queued or running, and (given expected) still correct."""
    stats = llm.stats()
    assert stats["blocks_used"] == 0
    assert stats["blocks_free"] + stats["blocks_cached_free"] == stats["blocks_total"]
    assert llm.num_waiting == 0
    assert not llm._loop.call(llm.engine.has_unfinished)
    if expected is not None:
        assert llm.generate("Once upon a time", GREEDY)[0].outputs[0].token_ids == expected


# -- 1. a request never outlives the failure of its call ---------------------------------
def test_a_tiny_temperature_is_greedy_not_nan(llm, expected):
    out = llm.generate("Once upon a time", SamplingParams(temperature=1e-320, max_tokens=8))
    assert out[0].outputs[0].token_ids == expected
    assert_whole(llm, expected)
    assert llm.beam_search("Once upon a time", 2, max_tokens=3)[0].beams
    assert len(llm.generate("Hi", SamplingParams(n=8, max_tokens=2))[0].outputs) == 8
    assert_whole(llm, expected)


def test_params_changed_after_construction_are_checked_again(llm, expected):
    params = SamplingParams(max_tokens=5)
    params.top_p = 0.0
    with pytest.raises(ValueError, match=r"top_p=0\.0 must be in \(0, 1\]"):
        llm.generate("Hi", params)
    good = SamplingParams(temperature=0, max_tokens=8)
    with pytest.raises(ValueError, match="prompt 1: top_p"):
        llm.generate(["Once upon a time", "Hi", "The dog"], [good, params, good])
    assert_whole(llm, expected)


def test_a_request_keeps_its_own_copy_of_the_params(llm, expected):
    params = SamplingParams(temperature=0, max_tokens=8, stop=["never"])
    handle = llm.submit("Once upon a time", params)
    params.max_tokens, params.stop[0] = 1, "Once"  # too late to matter
    assert handle.result().outputs[0].token_ids == expected
    assert_whole(llm, expected)


def test_a_bad_prompt_in_a_batch_queues_nothing(llm, expected):
    with pytest.raises(TypeError, match="prompt 1 must be text .* got 5 \\(int\\)"):
        llm.generate(["Once upon a time", 5], GREEDY)
    assert_whole(llm, expected)


def test_a_fractional_batch_budget_is_refused_at_construction(stories_dir):
    with pytest.raises(TypeError, match="max_num_batched_tokens must be an integer, got 3.5"):
        LLM(stories_dir, backend="cpu", max_num_batched_tokens=3.5)


def test_a_real_sigint_during_generate_leaves_the_pool_whole(llm, expected, monkeypatch, ctrl_c):
    gate = step_gate(llm, monkeypatch, closed=True)  # the requests run, and wait there

    def interrupt_once_running():
        assert gate.reached.wait(300)  # the three requests' first step waits at the gate,
        ctrl_c_while_waiting_for_output(threading.main_thread())  # and the caller for them
    signaller = threading.Thread(target=interrupt_once_running)
    signaller.start()
    with pytest.raises(KeyboardInterrupt):
        try:
            llm.generate(["Once upon a time", "The dog", "A cat"], LONG)
        finally:
            signaller.join()
            gate.open()
    monkeypatch.undo()
    assert_whole(llm, expected)


def test_generate_while_a_stream_is_open(llm, expected):
    deltas = llm.stream("Once upon a time", GREEDY)
    first = next(deltas)
    assert llm.generate("The dog", GREEDY)[0].finished
    assert first + "".join(deltas) == llm.generate("Once upon a time", GREEDY)[0].outputs[0].text
    assert_whole(llm, expected)


# -- 2. types and values, up front -----------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(temperature=math.inf), ValueError, "temperature=inf must be a finite number"),
    (dict(temperature=math.nan), ValueError, "temperature=nan"),
    (dict(temperature="0.5"), TypeError, r"temperature must be a number, got '0\.5' \(str\)"),
    (dict(n=True), TypeError, r"n must be an integer, got True \(bool\)"),
    (dict(seed=True), TypeError, "seed must be an integer"),
    (dict(max_tokens=True), TypeError, "max_tokens must be an integer"),
    (dict(max_tokens=3.0), TypeError, "max_tokens must be an integer"),
    (dict(ignore_eos="no"), TypeError, "ignore_eos must be True or False"),
    (dict(stop=5), TypeError, "stop must be a string or a list of strings, got int"),
    (dict(stop=[""]), ValueError, "stop strings must not be empty"),
    (dict(stop=["a\udc80"]), ValueError, "stop item is not valid text"),
    (dict(stop_token_ids=[True]), TypeError, "stop_token_ids item must be an integer"),
    (dict(stop_token_ids=3), TypeError, "stop_token_ids must be a list"),
    (dict(top_k=-2), ValueError, r"top_k=-2 must be in \[-1, 2147483647\]"),
    (dict(top_k=2**63), ValueError, r"top_k=9223372036854775808 must be in \[-1, 2147483647\]"),
    (dict(top_p=math.nan), ValueError, "top_p=nan must be a finite number"),
    (dict(min_p=1.5), ValueError, r"min_p=1\.5 must be in \[0, 1\]"),
    (dict(repetition_penalty=0), ValueError, "repetition_penalty=0 must be > 0"),
    (dict(presence_penalty="1"), TypeError, "presence_penalty must be a number"),
    (dict(logit_bias=[1, 2]), TypeError, "logit_bias must be a dict"),
    (dict(logit_bias={1: math.inf}), ValueError, r"logit_bias\[1\]=inf"),
    (dict(logprobs=True), TypeError, "logprobs must be an integer"),
])
def test_bad_sampling_params_name_the_field(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        SamplingParams(**kwargs)


def test_numpy_numbers_are_numbers():
    params = SamplingParams(max_tokens=np.int64(3), temperature=np.float32(0.5), seed=np.uint8(7),
                            stop_token_ids=np.array([2, 3]), logit_bias={np.int32(5): np.float64(1)})
    assert type(params.max_tokens) is int and params.max_tokens == 3
    assert type(params.temperature) is float and type(params.seed) is int
    assert params.stop_token_ids == [2, 3] and params.logit_bias == {5: 1.0}


@pytest.mark.parametrize("prompt, error, pattern", [
    (1.5, TypeError, r"prompt must be text \(str\) or token ids .* got 1\.5 \(float\)"),
    (None, TypeError, r"got None \(NoneType\)"),
    ({"text": "hi"}, TypeError, "a dict prompt has exactly one key"),
    ([1, "a"], TypeError, "item 1 is 'a'"),
    ([1, 2.0], TypeError, "item 1 is 2.0"),
    ([1, True], TypeError, "item 1 is True"),
    (np.array([1.0, 2.0]), TypeError, "integer dtype, got 1-D float64"),
    (np.zeros((2, 2, 2), dtype=int), ValueError, "1-D .* or 2-D"),
    ([1, 99999], ValueError, r"token id 99999 is out of range \[0, 512\)"),
    ("", ValueError, "prompt is empty"),
    ("abc\ud800", ValueError, "prompt is not valid text: '\\\\ud800' at character 3"),
    (b"Once", TypeError, r"got b'Once' \(bytes\)"),
])
def test_bad_prompts_are_named_before_any_work(llm, expected, prompt, error, pattern):
    steps = llm.stats()["steps"]
    with pytest.raises(error, match=pattern):
        llm.generate(prompt, GREEDY)
    assert llm.stats()["steps"] == steps
    assert_whole(llm)


def test_token_ids_in_every_accepted_form_agree(llm, expected):
    ids = llm.tokenizer.encode("Once upon a time")
    forms = [ids, tuple(ids), np.array(ids), np.array(ids, dtype=np.int32), {"prompt_token_ids": ids},
             {"prompt": "Once upon a time"}, [np.int64(t) for t in ids]]
    outs = llm.generate(forms, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == [expected] * len(forms)
    rows = llm.generate(np.array([ids, ids]), GREEDY)  # a 2-D array: one prompt per row
    assert [o.outputs[0].token_ids for o in rows] == [expected] * 2
    assert_whole(llm, expected)


def test_stream_checks_everything_at_the_call(llm, expected):
    with pytest.raises(ValueError, match="follows one prompt, got a list of 2"):
        llm.stream(["Once", "The dog"])
    with pytest.raises(ValueError, match="n=3"):
        llm.stream("Once", SamplingParams(n=3))
    with pytest.raises(TypeError, match="prompt must be text"):
        llm.stream(None)
    params = SamplingParams()
    params.temperature = -1
    with pytest.raises(ValueError, match="temperature=-1"):
        llm.stream("Once", params)
    assert_whole(llm, expected)


def test_a_request_id_is_text(llm, expected):
    with pytest.raises(TypeError, match=r"request_id must be a str, got 5 \(int\)"):
        llm.submit("Hi", GREEDY, request_id=5)
    assert llm.submit("Hi", GREEDY, request_id="mine").result().request_id == "mine"
    assert_whole(llm, expected)


def test_chat_messages_and_beam_arguments_are_checked(llm, expected):
    with pytest.raises(TypeError, match="messages must be a list of .* got str 'hello'"):
        llm.chat("hello")
    with pytest.raises(TypeError, match="beam_width must be an integer, got True"):
        llm.beam_search("Hi", True)
    with pytest.raises(ValueError, match="length_penalty=nan must be a finite number"):
        llm.beam_search("Hi", 2, length_penalty=math.nan)
    with pytest.raises(TypeError, match="ignore_eos must be True or False"):
        llm.beam_search("Hi", 2, ignore_eos="no")
    with pytest.raises(ValueError, match="stop_token_ids: token id 99999 is out of range"):
        llm.generate("Hi", SamplingParams(stop_token_ids=[99999]))
    assert_whole(llm, expected)


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(enable_prefix_caching="no"), TypeError, "enable_prefix_caching must be True or False"),
    (dict(max_model_len=100.5), TypeError, "max_model_len must be an integer, got 100.5"),
    (dict(kv_cache_memory="lots"), ValueError, "invalid size 'lots'"),
    (dict(kv_cache_memory="infG"), ValueError, "invalid size 'infG'"),
    (dict(kv_cache_memory=math.inf), ValueError, "kv_cache_memory=inf must be a finite number"),
    (dict(num_blocks=True), TypeError, "num_blocks must be an integer"),
    (dict(block_size=0), ValueError, "block_size=0 must be in"),
    (dict(backend="gpu"), ValueError, "backend='gpu' is not one of"),
    (dict(gpu_memory_utilization=0), ValueError, r"gpu_memory_utilization=0 must be in \(0, 1\]"),
    (dict(quantization="q3_k"), ValueError, "quantization='q3_k' is not one of 'q8_0', 'q4_0', 'q4_1'"),
    (dict(kv_cache_dtype="bfloat16"), ValueError,
     "kv_cache_dtype='bfloat16' is not one of 'auto', 'float32', 'float16'"),
    (dict(cuda_graphs="yes"), TypeError, "cuda_graphs must be True or False"),
])
def test_bad_engine_options_name_the_field(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        EngineConfig(**kwargs)


def test_cuda_graphs_on_a_cpu_engine_is_a_clear_error(stories_dir):
    with pytest.raises(ValueError, match="cuda_graphs=True needs the CUDA backend; this "
                                         "engine runs on cpu"):
        LLM(stories_dir, backend="cpu", cuda_graphs=True)


def test_size_strings_are_bytes():
    assert EngineConfig(kv_cache_memory="512M").kv_cache_memory == 512 << 20
    assert EngineConfig(kv_cache_memory="1.5GiB").kv_cache_memory == 3 << 29


# -- 4, 5. sizes checked before allocating; a default pool sized for the work ------------------
@pytest.mark.parametrize("kwargs", [dict(num_blocks=10 ** 9), dict(kv_cache_memory=1 << 50)])
def test_a_pool_larger_than_memory_is_one_clear_error(stories_dir, kwargs):
    with pytest.raises(ValueError, match=r"a KV pool of \d+ blocks x 20\.0 KiB needs [\d.]+ TiB, "
                                         r"and only [\d.]+ [GMT]iB is available"):
        LLM(stories_dir, backend="cpu", **kwargs)


def test_the_default_pool_holds_the_work_not_a_share_of_ram(stories_dir):
    with LLM(stories_dir, backend="cpu") as llm:  # 64 sequences x 512 tokens, + 25% for the cache
        assert llm.stats()["blocks_total"] == math.ceil(64 * (512 // 16) * 1.25)
        assert llm.stats()["kv_cache_bytes"] == 2560 * 20 * 1024
    with LLM(stories_dir, backend="cpu", max_num_seqs=4, max_model_len=100) as llm:
        assert llm.stats()["blocks_total"] == math.ceil(4 * 7 * 1.25)
        assert llm.engine.runner.model.rope.of_layer[0][0].shape == (100, 4)  # RoPE within max_model_len


def test_rope_tables_larger_than_memory_are_refused(stories_copy):
    stories_copy.edit_config(max_position_embeddings=10 ** 12)
    with pytest.raises(ValueError, match=r"RoPE tables for max_model_len=1000000000000 positions "
                                         r"needs .* give a smaller max_model_len"):
        LLM(stories_copy.path, backend="cpu")
    with LLM(stories_copy.path, backend="cpu", max_model_len=256) as llm:
        assert llm.generate("Once upon a time", GREEDY)[0].outputs[0].text


# -- 3. config.json and tokenizer files ------------------------------------------------------
@pytest.mark.parametrize("change, pattern", [
    (dict(eos_token_id="265"), r"eos_token_id must be a token id or a list of them in \[0, 512\), "
                               r"got '265'"),
    (dict(eos_token_id=[2, 600]), r"eos_token_id must be .* got \[2, 600\]"),
    (dict(bos_token_id=-1), "bos_token_id must be a token id"),
    (dict(num_hidden_layers=4), "num_hidden_layers=4, but the weights also hold layer 4"),
    (dict(num_hidden_layers=7), "num_hidden_layers=7, but the weights lack layers 5, 6"),
    (dict(architectures="LlamaForCausalLM"), "'architectures' must be a list of names"),
    (dict(hidden_size=64.0), "hidden_size must be an integer, got 64.0"),
    (dict(vocab_size="512"), "vocab_size must be an integer, got '512'"),
    (dict(tie_word_embeddings="yes"), "tie_word_embeddings must be true or false"),
    (dict(rope_theta=None, rms_norm_eps="small"), "rms_norm_eps must be a finite number"),
])
def test_config_json_is_checked(stories_copy, change, pattern):
    stories_copy.edit_config(**change)
    with pytest.raises(ValueError, match=pattern) as info:
        LLM(stories_copy.path, backend="cpu")
    assert str(stories_copy.path) in str(info.value)


def test_a_broken_tokenizer_config_names_its_file(stories_copy):
    (stories_copy.path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"tokenizer_config\.json: invalid JSON"):
        LLM(stories_copy.path, backend="cpu")


# -- 7, 8. text, and a sequence the pool cannot hold ---------------------------------------------
def test_a_character_cut_by_max_tokens_is_left_out_of_the_text(llm, expected):
    params = SamplingParams(temperature=0, max_tokens=1, logit_bias={BYTE_E2: 100})
    sample = llm.generate("Once upon a time", params)[0].outputs[0]
    assert sample.token_ids == [BYTE_E2] and sample.text == ""
    beams = llm.beam_search("Once upon a time", 1, max_tokens=1)[0].beams
    assert "\ufffd" not in beams[0].text
    assert_whole(llm, expected)


def test_a_sequence_the_pool_cannot_hold_has_its_own_finish_reason(stories_dir):
    with LLM(stories_dir, backend="cpu", num_blocks=2, block_size=16) as small:
        out = small.generate("Once upon a time", LONG)[0].outputs[0]
        assert out.finish_reason == KV_CACHE_FULL and len(out.token_ids) < LONG.max_tokens
        assert small.stats()["blocks_used"] == 0
    assert completion_choice(0, "", None, KV_CACHE_FULL)["finish_reason"] == "length"

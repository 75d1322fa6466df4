"""Never silently wrong: what a model asks for and tinypaged does not do is refused by
name, in one line: a config key nobody reads, a tensor nothing consumes, an
architecture, a RoPE kind, and bad values of the keys that are read."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import gguf_writer as gw
from test_hf_parity import FIXTURES, expected, write_gguf
from tinypaged.model.config import ModelConfig
from tinypaged.model.reference import ReferenceModel
from tinypaged.formats.safetensors_io import read_safetensors
from tinypaged.model.loading import load_model


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def fixture_copy(case: str, tmp_path, layout: str = "config.json"):
    folder = tmp_path / case
    shutil.copytree(os.path.join(FIXTURES, case), folder)
    if layout != "config.json":
        shutil.copy(folder / layout, folder / "config.json")
    return folder


def edit(folder, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("key, value", [
    ("attn_logit_softcapping", 50.0),  # Gemma 2's: changes every score
    ("partial_rotary_factor", 0.5),  # RoPE over half of each head
    ("query_pre_attn_scalar", 256),
    ("some_future_setting", True),  # nobody knows it: it may matter
])
def test_a_config_key_nobody_reads_is_refused_by_name(key, value, tmp_path):
    folder = fixture_copy("llama", tmp_path)
    edit(folder, **{key: value})
    with pytest.raises(ValueError) as e:
        load_model(folder)
    assert f"'{key}'" in one_line(e) and "refused" in str(e.value)


@pytest.mark.parametrize("key, value", [
    ("initializer_range", 0.5), ("use_cache", False), ("attention_dropout", 0.3),
    ("hidden_dropout_prob", 0.1), ("pad_token_id", 0), ("_name_or_path", "x"),
    ("transformers_version", "4.40.0"), ("torch_dtype", "bfloat16"),
    ("transformers.js_config", {"dtype": "q4"}), ("is_llama_config", True), ("rope_interleaved", False),
])
def test_keys_that_do_not_change_the_math_are_ignored(key, value, tmp_path):
    """Loaded, and the logits are the same bits as without the key."""
    plain = ReferenceModel(*load_model(fixture_copy("llama", tmp_path / "plain")))
    folder = fixture_copy("llama", tmp_path)
    edit(folder, **{key: value})
    edited = ReferenceModel(*load_model(folder))
    ids = expected("llama")[0][0]
    np.testing.assert_array_equal(edited.forward(ids, edited.new_cache(len(ids))),
                                  plain.forward(ids, plain.new_cache(len(ids))))


def test_a_tensor_nothing_consumes_is_refused_by_name(tmp_path):
    folder = fixture_copy("llama", tmp_path)
    from safetensors.numpy import save_file
    tensors = read_safetensors(folder / "model.safetensors")
    tensors["model.layers.0.self_attn.q_norm.weight"] = np.ones(16, np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ValueError) as e:
        load_model(folder)
    assert "'model.layers.0.self_attn.q_norm.weight'" in one_line(e)


def test_a_bias_the_config_does_not_declare_is_refused(tmp_path):
    """The o_proj bias dropped without a word before: now a Llama without
    attention_bias that carries biases is refused."""
    folder = fixture_copy("llama-bias", tmp_path)
    edit(folder, attention_bias=False)
    with pytest.raises(ValueError) as e:
        load_model(folder)
    assert "self_attn.o_proj.bias" in one_line(e) or "self_attn.k_proj.bias" in str(e.value)


@pytest.mark.parametrize("arch", ["StableLmForCausalLM", "OlmoForCausalLM", "MixtralForCausalLM"])
def test_an_unsupported_architecture_is_refused_by_name(arch, tmp_path):
    folder = fixture_copy("llama", tmp_path)
    edit(folder, architectures=[arch])
    with pytest.raises(ValueError) as e:
        load_model(folder)
    assert f"architecture '{arch}' is not supported" in one_line(e)


@pytest.mark.parametrize("layout", ["config.json", "config.v4.json"])
@pytest.mark.parametrize("rope, message", [
    ({"rope_type": "dynamic", "factor": 2.0}, "rope_type='dynamic'"),
    ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}, "LongRoPE"),
    ({"rope_type": "spiral", "factor": 2.0}, "rope_type='spiral' is not a RoPE kind"),
    ({"rope_type": "linear", "factor": 0.0}, "factor=0.0 must be a positive number"),
    ({"rope_type": "linear", "factor": -2}, "factor=-2 must be a positive number"),
    ({"rope_type": "linear"}, "needs 'factor'"),
    ({"rope_type": "linear", "factor": 2.0, "beta_fast": 3}, "'beta_fast'"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
      "original_max_position_embeddings": 16}, "high_freq_factor=1 must exceed"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": -32},
     "original_max_position_embeddings=-32 must be a positive number"),
    ("yarn", "must be an object"),
])
def test_bad_rope_settings_get_one_clear_line(rope, message, layout, tmp_path):
    folder = fixture_copy("llama", tmp_path, layout)
    key = "rope_parameters" if layout == "config.json" else "rope_scaling"
    if isinstance(rope, dict) and key == "rope_parameters":
        rope = {**rope, "rope_theta": 50000.0}
    edit(folder, **{key: rope})
    with pytest.raises(ValueError) as e:
        load_model(folder)
    assert message in one_line(e)


@pytest.mark.parametrize("case, changes, message", [
    ("mistral-window", {"sliding_window": 0}, "sliding_window=0 must be positive"),
    ("mistral-window", {"sliding_window": -8}, "sliding_window=-8 must be positive"),
    ("mistral-window", {"sliding_window": 8.5}, "sliding_window must be an integer"),
    ("qwen2-window", {"layer_types": ["full_attention"]}, "for each of the 2 layers"),
    ("qwen2-window", {"layer_types": ["full_attention", "chunked_attention"]},
     "for each of the 2 layers"),
    ("qwen2-window", {"layer_types": "sliding_attention"}, "for each of the 2 layers"),
    ("llama", {"mlp_bias": True}, "mlp_bias=true"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ("llama", {"rope_interleaved": True}, "rope_interleaved=true"),
    ("llama", {"rope_theta": 10000.0}, "rope_theta=10000.0 disagrees"),
])
def test_bad_values_of_the_keys_read_get_one_clear_line(case, changes, message, tmp_path):
    folder = fixture_copy(case, tmp_path)
    edit(folder, **changes)
    with pytest.raises(ValueError) as e:
        load_model(folder)
    assert message in one_line(e)


def test_both_rope_layouts_at_once_are_refused(tmp_path):
    folder = fixture_copy("llama3", tmp_path)
    edit(folder, rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ValueError) as e:
        load_model(folder)
    assert "both rope_parameters and rope_scaling" in one_line(e)


def test_the_older_layout_reads_rope_theta_where_the_newer_one_lost_it(tmp_path):
    """The issue's SmolLM2 re-saved by transformers 5 ran with theta 10000: read both."""
    new = ModelConfig.from_json(os.path.join(FIXTURES, "llama", "config.json"))
    old = ModelConfig.from_json(os.path.join(FIXTURES, "llama", "config.v4.json"))
    assert new.rope == old.rope and new.rope_theta == 50000.0


# -- GGUF: metadata keys and tensors ----------------------------------------------------

def rewrite_gguf(source, target, extra_metadata=(), extra_tensors=()) -> None:
    """target: the GGUF file source with metadata (replacing a key it has) and tensors
    added (via our reader)."""
    from tinypaged.formats.gguf import GGUFFile
    src = GGUFFile(source)
    w = gw.GGUFWriter()
    replaced = {key for key, _, _ in extra_metadata}
    for key, value in src.metadata.items():
        if key in replaced:
            continue
        if isinstance(value, list):
            w.add(key, gw.ARRAY, (gw.STRING if value and isinstance(value[0], str) else gw.I32, value))
        elif isinstance(value, str):
            w.add(key, gw.STRING, value)
        elif isinstance(value, float):
            w.add(key, gw.F32_T, value)
        else:
            w.add(key, gw.U32, int(value))
    for key, vtype, value in extra_metadata:
        w.add(key, vtype, value)
    for name in src.tensors:
        w.add_tensor(name, src.load(name))
    for name, x in extra_tensors:
        w.add_tensor(name, x)
    w.write(target)


@pytest.mark.parametrize("key, vtype, value", [
    ("llama.attention.sliding_window", gw.U32, 8),
    ("llama.attn_logit_softcapping", gw.F32_T, 50.0),
    ("llama.expert_count", gw.U32, 8),
    ("llama.rope.scaling.type", gw.STRING, "longrope"),
    ("llama.rope.dimension_count", gw.U32, 8),
    ("llama.attention.value_length", gw.U32, 32),
])
def test_a_gguf_metadata_key_that_matters_is_refused_by_name(key, vtype, value, tmp_path):
    write_gguf("llama", tmp_path / "base.gguf")
    rewrite_gguf(tmp_path / "base.gguf", tmp_path / "bad.gguf", [(key, vtype, value)])
    with pytest.raises(ValueError) as e:
        load_model(str(tmp_path / "bad.gguf"))
    assert key in one_line(e)


def test_a_gguf_tensor_nothing_consumes_is_refused_by_name(tmp_path):
    write_gguf("llama", tmp_path / "base.gguf")
    rewrite_gguf(tmp_path / "base.gguf", tmp_path / "bad.gguf",
                 extra_tensors=[("blk.0.attn_q_norm.weight", np.ones(16, np.float32))])
    with pytest.raises(ValueError) as e:
        load_model(str(tmp_path / "bad.gguf"))
    assert "'blk.0.attn_q_norm.weight'" in one_line(e)


def test_gguf_rope_freqs_of_the_wrong_length_are_refused(tmp_path):
    write_gguf("llama", tmp_path / "base.gguf")
    rewrite_gguf(tmp_path / "base.gguf", tmp_path / "bad.gguf",
                 extra_tensors=[("rope_freqs.weight", np.ones(3, np.float32))])
    with pytest.raises(ValueError) as e:
        load_model(str(tmp_path / "bad.gguf"))
    assert "rope_freqs.weight must hold 8 positive factors" in one_line(e)


# -- fuzzed values of the keys the families read -------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ANY_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=8)
ROPE_PARAMETERS = st.fixed_dictionaries(
    {"rope_type": st.sampled_from(["default", "linear", "llama3", "yarn", "dynamic", "longrope", "x"])},
    optional={"factor": ANY_VALUE, "rope_theta": ANY_VALUE, "low_freq_factor": ANY_VALUE,
              "high_freq_factor": ANY_VALUE, "original_max_position_embeddings": ANY_VALUE,
              "beta_fast": ANY_VALUE, "attention_factor": ANY_VALUE, "truncate": ANY_VALUE})
FUZZED_KEYS = {  # case -> keys of its family worth fuzzing
    "llama": ["rope_parameters", "rope_theta", "attention_bias", "head_dim", "mlp_bias"],
    "mistral-window": ["sliding_window"],
    "qwen2-window": ["sliding_window", "use_sliding_window", "max_window_layers", "layer_types"],
    "smollm3": ["no_rope_layers", "no_rope_layer_interval", "use_sliding_window"],
    "granite": ["embedding_multiplier", "residual_multiplier", "attention_multiplier",
                "logits_scaling"],
    "gemma2": ["query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
               "hidden_activation"],
    "gemma3": ["rope_parameters", "sliding_window_pattern", "rope_local_base_freq", "layer_types"],
}
CONFIGS = {case: json.loads(Path(FIXTURES, case, "config.json").read_text()) for case in FUZZED_KEYS}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(sorted(FUZZED_KEYS)), data=st.data())
def test_fuzzed_values_load_or_give_one_clear_line(case, data):
    config = dict(CONFIGS[case])
    key = data.draw(st.sampled_from(FUZZED_KEYS[case]))
    value = data.draw(ROPE_PARAMETERS if key == "rope_parameters" and data.draw(st.booleans())
                      else ANY_VALUE)
    config[key] = value
    try:
        ModelConfig.from_dict(config, "config.json")
    except ValueError as e:
        message = str(e)
        assert message.startswith("config.json") and "\n" not in message, message


# -- counts far beyond the file: refused before anything per layer is built -----------------------

def load_within(path, limit_bytes: int = 2 << 30) -> str:
    """load_model(path) in a child process that may map at most limit_bytes: its one-line
    error (a per-layer table of 10**9 layers would end it with a MemoryError)."""
    import subprocess
    import sys
    code = ("import resource, sys\n"
            f"resource.setrlimit(resource.RLIMIT_AS, ({limit_bytes}, {limit_bytes}))\n"
            "from tinypaged.model.loading import load_model\n"
            "try:\n    load_model(sys.argv[1])\nexcept ValueError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_config_with_a_billion_layers_is_refused_by_its_file(tmp_path):
    folder = fixture_copy("llama", tmp_path)
    edit(folder, num_hidden_layers=10 ** 9)
    assert "num_hidden_layers=1000000000 is more than any model has" in load_within(folder)
    edit(folder, num_hidden_layers=4000)  # below that bound: the tensors refuse it
    message = load_within(folder)
    assert message.startswith(str(folder)) and "num_hidden_layers=4000, but the weights " \
        "lack layers 2-3999" in message


@pytest.mark.parametrize("case, arch", [("llama", "llama"), ("gemma3-gguf", "gemma3")])
def test_a_gguf_with_a_billion_blocks_is_refused_by_its_file(case, arch, tmp_path):
    write_gguf(case, tmp_path / "base.gguf")
    rewrite_gguf(tmp_path / "base.gguf", tmp_path / "bad.gguf", [(f"{arch}.block_count", gw.U32, 10 ** 9)])
    message = load_within(tmp_path / "bad.gguf")
    assert "bad.gguf" in message and "num_hidden_layers=1000000000" in message, message


# -- non-finite weights and logits ----------------------------------------------------------------

def nan_norm(folder, name: str = "model.norm.weight", value: float = np.nan) -> None:
    """folder's model.safetensors with one tensor's values set to value."""
    from helpers import write_safetensors
    tensors = read_safetensors(folder / "model.safetensors")
    tensors[name] = np.full_like(tensors[name], value, dtype=np.float32)
    write_safetensors(str(folder / "model.safetensors"), tensors)


@pytest.mark.parametrize("name", ["model.norm.weight", "model.layers.0.input_layernorm.weight",
                                  "model.embed_tokens.weight"])
def test_non_finite_norms_and_embeddings_are_refused_at_load(name, tmp_path):
    folder = fixture_copy("llama", tmp_path)
    nan_norm(folder, name)
    with pytest.raises(ValueError) as e:
        load_model(str(folder))
    assert str(folder) in one_line(e) and repr(name) in one_line(e) and "non-finite" in one_line(e)


def test_logits_that_overflow_fail_the_request_with_a_clear_error(stories_copy):
    from tinypaged import LLM, SamplingParams
    nan_norm(stories_copy.path, "model.norm.weight", 3e38)  # finite, but the logits overflow
    with LLM(str(stories_copy.path), backend="cpu") as llm:
        with pytest.raises(Exception, match="logits are not finite") as e:
            llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0))
        assert "\n" not in str(e.value)
        assert llm.stats()["blocks_used"] == 0 and llm.is_alive  # nothing left behind

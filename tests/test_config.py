import json

import pytest

from helpers import tiny_config_dict
from tinypaged.model.config import ModelConfig


def test_llama_config_with_gqa_and_tied_embeddings():
    cfg = ModelConfig.from_dict(tiny_config_dict(tie_word_embeddings=True, rope_theta=1e5))
    assert cfg.architecture == "LlamaForCausalLM"
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 8)
    assert (cfg.q_size, cfg.kv_size) == (32, 16)
    assert cfg.tie_word_embeddings and cfg.rope_theta == 1e5
    assert cfg.attention_bias is False
    assert cfg.eos_token_ids == [2]


def test_qwen2_has_qkv_bias_and_list_of_eos_ids():
    cfg = ModelConfig.from_dict(tiny_config_dict("Qwen2ForCausalLM", eos_token_id=[2, 0]))
    assert cfg.attention_bias is True
    assert cfg.eos_token_ids == [2, 0]


def test_mistral_and_explicit_head_dim():
    cfg = ModelConfig.from_dict(tiny_config_dict("MistralForCausalLM", head_dim=16,
                                                 sliding_window=4096))
    assert cfg.head_dim == 16 and cfg.q_size == 64


def test_missing_kv_heads_means_multi_head_attention():
    d = tiny_config_dict()
    del d["num_key_value_heads"]
    assert ModelConfig.from_dict(d).num_key_value_heads == 4


def test_unsupported_architecture_names_it_and_the_supported_ones():
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM.*Qwen2ForCausalLM"):
        ModelConfig.from_dict(tiny_config_dict("GPT2LMHeadModel"))


@pytest.mark.parametrize("change, message", [
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads=3"),
    ({"hidden_size": 30}, "hidden_size=30 is not divisible"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"rope_scaling": {"type": "llama3"}}, "rope_scaling"),
    ({"vocab_size": 0}, "vocab_size=0 must be positive"),
    ({"vocab_size": "many"}, "vocab_size must be an integer, got 'many'"),
])
def test_invalid_values_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict(tiny_config_dict(**change))


def test_missing_required_key_is_named():
    d = tiny_config_dict()
    del d["hidden_size"]
    with pytest.raises(ValueError, match="'hidden_size'"):
        ModelConfig.from_dict(d)


def test_unknown_keyword_is_an_error():
    with pytest.raises(TypeError):
        ModelConfig(architecture="LlamaForCausalLM", vocab_size=8, hidden_size=8,
                    intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=2, hidden_sizee=8)


def test_from_json_reads_a_folder_or_a_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny_config_dict()))
    assert ModelConfig.from_json(tmp_path) == ModelConfig.from_json(tmp_path / "config.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        ModelConfig.from_json(tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError, match="nowhere"):
        ModelConfig.from_json(tmp_path / "nowhere")

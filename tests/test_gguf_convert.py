"""GGUF -> HF folder: a tiny Llama written in llama.cpp's layout converts back exactly."""
import json

import numpy as np
import pytest

import gguf_writer as gw
from helpers import CHATML_TEMPLATE, MERGES, SPECIAL_TOKENS, random_weights, tiny_config_dict
from tokenizers import pre_tokenizers
from tinypaged.model.config import ModelConfig
from tinypaged.model.gguf_convert import convert_gguf
from tinypaged.model.reference import ReferenceModel
from tinypaged.model.loading import load_model
from tinypaged.tokenizer import Tokenizer

GGUF_MERGES = MERGES + [("1", "2")]  # a digit merge that the smollm pre-tokenizer must block
TOKENS = SPECIAL_TOKENS + sorted(pre_tokenizers.ByteLevel.alphabet()) + ["".join(m) for m in GGUF_MERGES]
LAYER_NAMES = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
               "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
               "self_attn.o_proj.weight": "attn_output.weight",
               "post_attention_layernorm.weight": "ffn_norm.weight",
               "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
               "mlp.down_proj.weight": "ffn_down.weight"}


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to Q/K rows: per head, the two rotate-half
    halves are interleaved into (x0, x_half, x1, x_half+1, ...) pairs."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_llama_gguf(path, arch="llama", ffn_up_type=gw.GGML_Q8_0, matrix_type=gw.GGML_F32,
                          hidden=32, intermediate=48):
    """Returns (the HF config dict, the weights a correct converter must reproduce).
    ffn_up is stored as ffn_up_type, every other layer matrix as matrix_type."""
    cfg_dict = tiny_config_dict(vocab_size=len(TOKENS), eos_token_id=2, bos_token_id=0,
                                hidden_size=hidden, intermediate_size=intermediate)
    cfg = ModelConfig.from_dict(cfg_dict)
    weights = random_weights(cfg, seed=7)
    w = gw.GGUFWriter()
    for key, vtype, value in [
            ("general.architecture", gw.STRING, arch), (f"{arch}.block_count", gw.U32, 2),
            (f"{arch}.context_length", gw.U32, 64), (f"{arch}.embedding_length", gw.U32, hidden),
            (f"{arch}.feed_forward_length", gw.U32, intermediate),
            (f"{arch}.attention.head_count", gw.U32, 4),
            (f"{arch}.attention.head_count_kv", gw.U32, 2), (f"{arch}.rope.freq_base", gw.F32_T, 10000.0),
            (f"{arch}.attention.layer_norm_rms_epsilon", gw.F32_T, 1e-5),
            ("tokenizer.ggml.model", gw.STRING, "gpt2"), ("tokenizer.ggml.pre", gw.STRING, "smollm"),
            ("tokenizer.ggml.tokens", gw.ARRAY, (gw.STRING, TOKENS)),
            ("tokenizer.ggml.token_type", gw.ARRAY, (gw.I32, [3] * 3 + [1] * (len(TOKENS) - 3))),
            ("tokenizer.ggml.merges", gw.ARRAY, (gw.STRING, [f"{a} {b}" for a, b in GGUF_MERGES])),
            ("tokenizer.ggml.bos_token_id", gw.U32, 0), ("tokenizer.ggml.eos_token_id", gw.U32, 2),
            ("tokenizer.chat_template", gw.STRING, CHATML_TEMPLATE)]:
        w.add(key, vtype, value)
    w.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", weights["model.norm.weight"])
    w.add_tensor("output.weight", weights["lm_head.weight"])
    for layer in range(cfg.num_hidden_layers):
        for hf, gg in LAYER_NAMES.items():
            x = weights[f"model.layers.{layer}.{hf}"]
            if gg == "attn_q.weight":
                x = llama_cpp_permute(x, cfg.num_attention_heads)
            elif gg == "attn_k.weight":
                x = llama_cpp_permute(x, cfg.num_key_value_heads)
            t = ffn_up_type if gg == "ffn_up.weight" else gw.GGML_F32 if "norm" in gg else matrix_type
            if t in gw.RAW_ONLY:  # no quantiser here: random blocks (zeros for Q2_K)
                raw = gw.random_raw_blocks(np.random.default_rng(layer), t, x.size)
                w.add_raw_tensor(f"blk.{layer}.{gg}", x.shape, t, raw.tobytes())
                if t != gw.GGML_Q2_K:  # what the file decodes to, by llama.cpp's package
                    from gguf import quants  # (tests only)
                    weights[f"model.layers.{layer}.{hf}"] = quants.dequantize(raw, t).reshape(x.shape)
                continue
            w.add_tensor(f"blk.{layer}.{gg}", x, t)
            if t != gw.GGML_F32:  # what the file decodes to, in HF's row order (quantizing
                hf_rows = weights[f"model.layers.{layer}.{hf}"]  # works row by row)
                weights[f"model.layers.{layer}.{hf}"] = gw.encode_tensor(hf_rows, t)[1]
    w.write(path)
    return cfg_dict, weights


def test_converted_folder_reproduces_the_original_model(tmp_path):
    cfg_dict, weights = write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out")
    cfg, loaded = load_model(tmp_path / "out")
    assert cfg == ModelConfig.from_dict(cfg_dict | {"torch_dtype": "float16"})  # as written
    for name, want in weights.items():  # stored as float16: 11 bits of mantissa
        np.testing.assert_allclose(loaded[name], want, rtol=2 ** -11, atol=1e-6, err_msg=name)
    ids = np.arange(0, 250, 13)
    ref = ReferenceModel(cfg, weights)
    got = ReferenceModel(cfg, loaded).forward(ids, ref.new_cache(32))
    np.testing.assert_allclose(got, ref.forward(ids, ref.new_cache(32)), rtol=1e-2, atol=1e-2)


def test_a_missing_unpermute_would_be_caught(tmp_path):
    """Guard for the test above: permuted Q rows are far from the HF ones."""
    _, weights = write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    assert np.abs(llama_cpp_permute(q, 4) - q).max() > 0.1


def test_tokenizer_is_rebuilt_from_the_gguf_vocab(tmp_path):
    write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out")
    tok = Tokenizer(tmp_path / "out")
    text = "so the 12 thé ☃ 🙂"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert TOKENS.index("Ġthe") in ids  # merges apply
    assert TOKENS.index("12") not in ids  # digits stay single (smollm pre-tokenizer)
    assert tok.encode("<|im_start|>user")[0] == 1  # special tokens are one id
    config = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>" and config["chat_template"] == CHATML_TEMPLATE
    assert tok.eos_token_id == 2


def test_unsupported_architecture_and_type_and_existing_output(tmp_path):
    write_tiny_llama_gguf(tmp_path / "gpt2.gguf", arch="gpt2")
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
        convert_gguf(tmp_path / "gpt2.gguf", tmp_path / "a")
    write_tiny_llama_gguf(tmp_path / "q2.gguf", ffn_up_type=gw.GGML_Q2_K)
    with pytest.raises(ValueError, match="'blk.0.ffn_up.weight' uses quantisation type Q2_K"):
        convert_gguf(tmp_path / "q2.gguf", tmp_path / "a")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ValueError, match="already exists"):
        convert_gguf(tmp_path / "gpt2.gguf", tmp_path / "full")
    assert not (tmp_path / "a").exists() and not (tmp_path / "a.partial").exists()


def test_convert_on_the_command_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    cli = Path(__file__).resolve().parents[1] / "cli.py"
    result = subprocess.run([sys.executable, str(cli), "convert", str(tmp_path / "tiny.gguf"),
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stderr
    cfg, _ = load_model(tmp_path / "out")
    assert cfg.num_hidden_layers == 2 and cfg.num_key_value_heads == 2

"""The dense reference forward against a straightforward float64 computation."""
import math

import numpy as np
import pytest

from helpers import random_weights, tiny_config_dict
from tinypaged.model.config import ModelConfig
from tinypaged.model.reference import ReferenceModel


def naive_forward(cfg: ModelConfig, weights: dict, ids: list[int]) -> np.ndarray:
    """Llama by the textbook, in float64, one position and one head at a time."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    n_heads, n_kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    half = d // 2

    def norm(v, g):
        return v / math.sqrt(sum(t * t for t in v) / len(v) + cfg.rms_norm_eps) * g

    def rotate(vec, pos):  # rotate-half RoPE: pair (i, i + D/2) turns by pos * theta^(-2i/D)
        out = vec.copy()
        for i in range(half):
            angle = pos * cfg.rope_theta ** (-2 * i / d)
            c, s = math.cos(angle), math.sin(angle)
            out[i] = vec[i] * c - vec[i + half] * s
            out[i + half] = vec[i + half] * c + vec[i] * s
        return out

    xs = [w["model.embed_tokens.weight"][t].copy() for t in ids]
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        qs, ks, vs = [], [], []
        for pos, x in enumerate(xs):
            h = norm(x, w[p + "input_layernorm.weight"])
            q, k, v = (w[p + f"self_attn.{n}_proj.weight"] @ h for n in "qkv")
            if cfg.attention_bias:
                q, k, v = (a + w[p + f"self_attn.{n}_proj.bias"] for a, n in zip((q, k, v), "qkv"))
            qs.append([rotate(q[j * d:(j + 1) * d], pos) for j in range(n_heads)])
            ks.append([rotate(k[j * d:(j + 1) * d], pos) for j in range(n_kv)])
            vs.append([v[j * d:(j + 1) * d] for j in range(n_kv)])
        new_xs = []
        for t, x in enumerate(xs):
            heads = []
            for j in range(n_heads):
                kv = j // (n_heads // n_kv)
                scores = [qs[t][j] @ ks[s][kv] / math.sqrt(d) for s in range(t + 1)]
                m = max(scores)
                e = [math.exp(sc - m) for sc in scores]
                heads.append(sum(e[s] / sum(e) * vs[s][kv] for s in range(t + 1)))
            x = x + w[p + "self_attn.o_proj.weight"] @ np.concatenate(heads)
            h = norm(x, w[p + "post_attention_layernorm.weight"])
            g, u = w[p + "mlp.gate_proj.weight"] @ h, w[p + "mlp.up_proj.weight"] @ h
            new_xs.append(x + w[p + "mlp.down_proj.weight"] @ (g / (1 + np.exp(-g)) * u))
        xs = new_xs
    return np.stack([w["lm_head.weight"] @ norm(x, w["model.norm.weight"]) for x in xs])


CASES = {
    "llama-gqa": tiny_config_dict(),
    "llama-tied-mha": tiny_config_dict(num_key_value_heads=4, tie_word_embeddings=True),
    "qwen2-bias": tiny_config_dict("Qwen2ForCausalLM", rope_theta=1e6),
    "mistral-mqa": tiny_config_dict("MistralForCausalLM", num_key_value_heads=1, head_dim=16),
}


@pytest.mark.parametrize("case", list(CASES))
def test_reference_forward_matches_the_textbook_computation(case):
    cfg = ModelConfig.from_dict(CASES[case])
    weights = random_weights(cfg, seed=11)
    if cfg.tie_word_embeddings:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    ids = list(np.random.default_rng(5).integers(0, cfg.vocab_size, size=9))
    expected = naive_forward(cfg, weights, ids)
    m64 = ReferenceModel(cfg, weights, dtype=np.float64)
    np.testing.assert_allclose(m64.forward(ids, m64.new_cache()), expected, rtol=1e-9, atol=1e-9)
    m32 = ReferenceModel(cfg, weights)
    np.testing.assert_allclose(m32.forward(ids, m32.new_cache()), expected, rtol=1e-4, atol=1e-4)


def test_incremental_decoding_with_the_cache_equals_one_full_pass():
    cfg = ModelConfig.from_dict(tiny_config_dict())
    model = ReferenceModel(cfg, random_weights(cfg, seed=3), dtype=np.float64)
    ids = list(np.random.default_rng(8).integers(0, cfg.vocab_size, size=12))
    full = model.forward(ids, model.new_cache())
    cache = model.new_cache(16)
    steps = [model.forward(ids[:5], cache, all_logits=False)]
    steps += [model.forward([t], cache) for t in ids[5:]]
    np.testing.assert_allclose(np.concatenate(steps), full[4:], rtol=1e-10, atol=1e-10)
    assert cache.length == 12


def test_forward_rejects_bad_input():
    cfg = ModelConfig.from_dict(tiny_config_dict())
    model = ReferenceModel(cfg, random_weights(cfg))
    with pytest.raises(ValueError, match="exceeds the cache capacity of 4"):
        model.forward([1, 2, 3, 4, 5], model.new_cache(4))
    with pytest.raises(ValueError, match="token id out of range"):
        model.forward([cfg.vocab_size], model.new_cache(4))
    with pytest.raises(ValueError, match="at least one token"):
        model.forward([], model.new_cache(4))

"""A family is its own file and a line in the registry (model/families.py). A made-up
one, defined here and registered, with a layer none of the real families has (GPT-J's
parallel attention and MLP over one norm, q and k normed per head, both blocks scaled
by a gain from its own config key): it loads from a HF folder, holds exactly the
tensors its layer reads, and runs on the paged engine as the dense reference runs it."""
import pytest

from helpers import dense_greedy, random_weights, write_safetensors, write_tiny_model
from tinypaged import LLM, SamplingParams
from tinypaged.model import families
from tinypaged.model.config import ModelConfig
from tinypaged.model.family import Family, attention_biases
from tinypaged.model.loading import load_model
from tinypaged.model.reference import ReferenceModel
from tinypaged.model.weights import expected_shapes


def read(get, layers: int) -> dict:
    gain = get.number("block_gain", 1.0)
    return {**attention_biases(get), "settings": {"block_gain": gain}}


def layer(p, x, residual):
    """x + gain (attention(norm(x)) + mlp(norm(x))): both blocks read one norm."""
    gain = p.cfg.settings["block_gain"]
    h = p.norm(x, "input_layernorm")
    both = p.add(p.attention(h, qk_norm="head"), p.mlp(h))
    return p.add(x, p.scale(both, gain)), None


PARALLEL = Family("ParallelForCausalLM", frozenset({"attention_bias", "block_gain"}), read,
                  layer=layer)


@pytest.fixture
def parallel_family(monkeypatch):
    monkeypatch.setitem(families.FAMILIES, PARALLEL.name, PARALLEL)  # its registry line


def test_a_made_up_family_holds_what_its_layer_reads(parallel_family, tmp_path):
    write_tiny_model(str(tmp_path), arch=PARALLEL.name, block_gain=0.5)
    cfg = ModelConfig.from_json(tmp_path)
    assert cfg.family is PARALLEL and cfg.settings == {"block_gain": 0.5}
    layer0 = {name[len("model.layers.0."):]: shape for name, shape in expected_shapes(cfg).items()
              if name.startswith("model.layers.0.")}
    assert set(layer0) == {"input_layernorm.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
                           *(f"self_attn.{n}_proj.weight" for n in "qkvo"),
                           *(f"mlp.{n}_proj.weight" for n in ("gate", "up", "down"))}
    assert layer0["self_attn.q_norm.weight"] == (cfg.head_dim,)


def test_a_made_up_family_runs_paged_as_the_reference_runs_it(parallel_family, tmp_path):
    write_tiny_model(str(tmp_path), arch=PARALLEL.name, block_gain=0.5)
    prompt = [5, 17, 42, 9, 100, 3]
    want = dense_greedy(ReferenceModel(*load_model(tmp_path)), prompt, 8)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for backend in ("cpu", "reference"):
        got = LLM(tmp_path, backend=backend, num_blocks=16, block_size=4).generate([prompt], greedy)[0]
        assert got.outputs[0].token_ids == want, backend
    # its own key changes its math: another gain, other logits
    write_tiny_model(str(tmp_path / "other"), arch=PARALLEL.name, block_gain=2.0)
    assert dense_greedy(ReferenceModel(*load_model(tmp_path / "other")), prompt, 8) != want


def test_a_made_up_family_refuses_weights_its_layer_does_not_read(parallel_family, tmp_path):
    write_tiny_model(str(tmp_path), arch=PARALLEL.name)
    cfg = ModelConfig.from_json(tmp_path)
    weights = random_weights(cfg)
    weights["model.layers.1.post_attention_layernorm.weight"] = weights["model.layers.1.input_layernorm.weight"]
    write_safetensors(str(tmp_path / "model.safetensors"), weights, "F32")
    with pytest.raises(ValueError, match="post_attention_layernorm.weight'.* does not use"):
        load_model(tmp_path)
    del weights["model.layers.1.post_attention_layernorm.weight"], weights["model.layers.0.self_attn.k_norm.weight"]
    write_safetensors(str(tmp_path / "model.safetensors"), weights, "F32")
    with pytest.raises(ValueError, match="'model.layers.0.self_attn.k_norm.weight' is missing"):
        load_model(tmp_path)

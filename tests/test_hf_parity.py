"""Each architecture against an independent oracle: tiny random models made and
measured by HF transformers (tools/make_hf_fixtures.py; fixtures in
tests/fixtures/hf/<case>/), loaded here from both config layouts and compared at
every position: the dense reference's logits, and the paged engine's prompt
logprobs (chunked prefill, prefix caching on and off), and the GGUF files
llama.cpp's converter would write for the same models."""
import json
import os
import shutil

import numpy as np
import pytest
from tokenizers import Tokenizer, models

from tinypaged import LLM, SamplingParams
from tinypaged.model.reference import ReferenceModel
from tinypaged.model.loading import load_model

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "hf")
CASES = sorted(os.listdir(FIXTURES))
LAYOUTS = ["config.json", "config.v4.json"]  # transformers >= 5, and older
RTOL = 1e-4  # of the logits' spread


def expected(case: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """[(prompt ids (T,), transformers' logits (T, vocab))] of a case."""
    data = np.load(os.path.join(FIXTURES, case, "logits.npz"))
    return [(data[f"prompt_{i}"], data[f"logits_{i}"]) for i in range(len(data.files) // 2)]


def window_of(case: str) -> int | None:
    with open(os.path.join(FIXTURES, case, "config.json")) as f:
        config = json.load(f)
    if config["model_type"] in ("qwen2", "qwen3", "smollm3") and not config.get("use_sliding_window"):
        return None
    return config.get("sliding_window")


def model_folder(case: str, layout: str, root) -> str:
    """The fixture as a model folder with layout as its config.json, and a word-level
    tokenizer over the fixture's vocabulary (the engine needs one; the tests pass ids)."""
    folder = root / f"{case}-{layout}"
    folder.mkdir()
    source = os.path.join(FIXTURES, case)
    shutil.copy(os.path.join(source, layout), folder / "config.json")
    os.symlink(os.path.join(source, "model.safetensors"), folder / "model.safetensors")
    with open(folder / "config.json") as f:
        vocab = json.load(f)["vocab_size"]
    Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0")).save(
        str(folder / "tokenizer.json"))
    return str(folder)


def assert_close(actual: np.ndarray, wanted: np.ndarray, what: str) -> None:
    spread = float(wanted.max() - wanted.min())
    error = np.abs(actual - wanted)
    worst = np.unravel_index(int(np.argmax(error)), error.shape)
    assert error.max() <= RTOL * spread, (f"{what}: off by {error.max():.3g} at {worst} "
                                          f"(bound {RTOL * spread:.3g})")


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CASES)
def test_the_reference_matches_transformers(case, layout, tmp_path):
    model = ReferenceModel(*load_model(model_folder(case, layout, tmp_path)))
    for ids, logits in expected(case):
        assert_close(model.forward(ids, model.new_cache(len(ids))), logits, f"{case} {layout}")


def engine(case: str, layout: str, root, **kwargs) -> LLM:
    """The fixtures are float16 checkpoints; the KV pool kept float32 as transformers
    keeps K and V here, so the tolerances measure the engine's math alone."""
    return LLM(model_folder(case, layout, root), backend="cpu", block_size=4,
               kv_cache_dtype="float32", **kwargs)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CASES)
def test_the_paged_engine_matches_transformers_at_every_prompt_position(case, layout, tmp_path):
    """Prompt logprobs (the token's and the top 20), prefilled in chunks of 16 tokens."""
    llm = engine(case, layout, tmp_path, max_num_batched_tokens=16)
    params = SamplingParams(max_tokens=1, prompt_logprobs=20, temperature=0)
    cases = expected(case)
    for out, (ids, logits) in zip(llm.generate([ids.tolist() for ids, _ in cases], params), cases):
        wanted = log_softmax(logits)
        for t, entry in enumerate(out.prompt_token_logprobs[1:], start=1):
            assert entry.token_id == ids[t]
            got = dict(entry.top) | {entry.token_id: entry.logprob}
            tokens = list(got)
            assert_close(np.array([got[k] for k in tokens]), wanted[t - 1, tokens],
                         f"{case} {layout} position {t}")
    llm.close()


@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_the_paged_engine_matches_transformers_after_each_prefix(case, prefix_caching, tmp_path):
    """The next token's logprobs after every prefix of a prompt, asked one prefix after
    another: with prefix caching, each reuses the blocks of the ones before."""
    llm = engine(case, "config.json", tmp_path, enable_prefix_caching=prefix_caching)
    params = SamplingParams(max_tokens=1, logprobs=20, temperature=0, ignore_eos=True)
    for ids, logits in expected(case):
        wanted = log_softmax(logits)
        for t in range(len(ids)):
            entry = llm.generate([ids[:t + 1].tolist()], params)[0].outputs[0].token_logprobs[0]
            got = dict(entry.top)
            tokens = list(got)
            assert_close(np.array([got[k] for k in tokens]), wanted[t, tokens],
                         f"{case} after {t + 1} tokens")
    hits = llm.stats()["prefix_cache_hit_tokens"]
    assert hits > 0 if prefix_caching else hits == 0
    llm.close()


# -- the same models as llama.cpp's converter (convert_hf_to_gguf.py) writes them ------

GGUF_LAYER = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "post_attention_layernorm.weight": "ffn_norm.weight",
              "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
              "mlp.down_proj.weight": "ffn_down.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
              "self_attn.k_norm.weight": "attn_k_norm.weight"}
def model_type(case: str) -> str:
    with open(os.path.join(FIXTURES, case, "config.json")) as f:
        return json.load(f)["model_type"]


# the GGUF architectures read so far. llama.cpp writes no sliding window for llama
# (Mistral), qwen2 or qwen3, and fixes Gemma 3's local RoPE and layer pattern: the
# cases it cannot express stay out (gemma3-gguf is Gemma 3 as llama.cpp fixes it, and
# smollm3-gguf SmolLM3: RoPE off in every 4th layer, which no key records)
GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma",
             "gemma2": "gemma2", "gemma3_text": "gemma3", "granite": "granite", "olmo2": "olmo2",
             "phi3": "phi3", "smollm3": "smollm3"}
GGUF_CASES = [c for c in CASES if model_type(c) in GGUF_ARCH and c not in ("gemma3", "smollm3")
              and (window_of(c) is None or model_type(c).startswith(("gemma", "phi3")))]
OLMO2_NORMS = {"post_attention_layernorm.weight": "post_attention_norm.weight",
               "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}
# HF names -> llama.cpp's, where the sandwich norms of Gemma 2 and 3 differ from Llama's
GEMMA_NORMS = {"post_attention_layernorm.weight": "post_attention_norm.weight",
               "pre_feedforward_layernorm.weight": "ffn_norm.weight",
               "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}


def llama_cpp_rope_freqs(rope: dict, head_dim: int) -> np.ndarray:
    """Llama 3's RoPE scaling as llama.cpp's converter stores it: a factor a pair."""
    freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    old = rope["original_max_position_embeddings"]
    low, high, factor = rope["low_freq_factor"], rope["high_freq_factor"], rope["factor"]
    factors = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_gguf(case: str, path, matrix_type: int | None = None, source: str | None = None,
               extra: tuple = ()) -> None:
    """matrix_type: the ggml type of the fused Phi-3 matrices (default F32). source: the
    model folder (default the case's fixture; a bare base model's tensors, without
    "model.", are read as a causal model's). extra: (key, type, value) metadata more."""
    import gguf_writer as gw
    from test_gguf_convert import llama_cpp_permute
    from tinypaged.formats.safetensors_io import read_safetensors

    folder = source or os.path.join(FIXTURES, case)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    weights = read_safetensors(os.path.join(folder, "model.safetensors"))
    weights = {k if k.startswith(("model.", "lm_head.")) else "model." + k: v for k, v in weights.items()}
    arch = GGUF_ARCH[config["model_type"]]
    gemma = arch.startswith("gemma")
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    rope = config["rope_parameters"].get("full_attention", config["rope_parameters"])
    w = gw.GGUFWriter()
    for key, vtype, value in [
            ("general.architecture", gw.STRING, arch), ("general.name", gw.STRING, case),
            (f"{arch}.block_count", gw.U32, config["num_hidden_layers"]),
            (f"{arch}.context_length", gw.U32, config["max_position_embeddings"]),
            (f"{arch}.embedding_length", gw.U32, config["hidden_size"]),
            (f"{arch}.feed_forward_length", gw.U32, config["intermediate_size"]),
            (f"{arch}.attention.head_count", gw.U32, heads),
            (f"{arch}.attention.head_count_kv", gw.U32, kv_heads),
            (f"{arch}.rope.freq_base", gw.F32_T, rope["rope_theta"]),
            (f"{arch}.rope.dimension_count", gw.U32, head_dim),
            (f"{arch}.attention.layer_norm_rms_epsilon", gw.F32_T, config["rms_norm_eps"]),
            ("tokenizer.ggml.model", gw.STRING, "gpt2"), ("tokenizer.ggml.pre", gw.STRING, "default"),
            ("tokenizer.ggml.tokens", gw.ARRAY, (gw.STRING, [f"t{i}" for i in range(config["vocab_size"])])),
            ("tokenizer.ggml.merges", gw.ARRAY, (gw.STRING, [])),
            ("tokenizer.ggml.bos_token_id", gw.U32, 1), ("tokenizer.ggml.eos_token_id", gw.U32, 2)]:
        w.add(key, vtype, value)
    for key, vtype, value in extra:
        w.add(key, vtype, value)
    if gemma:
        w.add(f"{arch}.attention.key_length", gw.U32, head_dim)
        w.add(f"{arch}.attention.value_length", gw.U32, head_dim)
    if arch in ("gemma2", "gemma3") or (arch == "phi3" and config.get("sliding_window")):
        w.add(f"{arch}.attention.sliding_window", gw.U32, config["sliding_window"])
    if arch == "granite":  # llama.cpp's names for the four multipliers
        for key, name in (("embedding_scale", "embedding_multiplier"),
                          ("residual_scale", "residual_multiplier"),
                          ("logit_scale", "logits_scaling"), ("attention.scale", "attention_multiplier")):
            w.add(f"{arch}.{key}", gw.F32_T, config[name])
    if arch == "gemma2":
        w.add(f"{arch}.attn_logit_softcapping", gw.F32_T, config["attn_logit_softcapping"])
        w.add(f"{arch}.final_logit_softcapping", gw.F32_T, config["final_logit_softcapping"])
    if rope["rope_type"] in ("linear", "yarn"):
        w.add(f"{arch}.rope.scaling.type", gw.STRING, rope["rope_type"])
        w.add(f"{arch}.rope.scaling.factor", gw.F32_T, rope["factor"])
        if rope["rope_type"] == "yarn":
            w.add(f"{arch}.rope.scaling.original_context_length", gw.U32,
                  rope["original_max_position_embeddings"])
    elif rope["rope_type"] == "llama3":
        w.add_tensor("rope_freqs.weight", llama_cpp_rope_freqs(rope, head_dim))
    offset = np.float32(1.0 if gemma else 0.0)  # llama.cpp stores Gemma's norms as 1 + w
    w.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"].astype(np.float32))
    w.add_tensor("output_norm.weight", weights["model.norm.weight"].astype(np.float32) + offset)
    if not config["tie_word_embeddings"]:
        w.add_tensor("output.weight", weights["lm_head.weight"].astype(np.float32))
    if arch == "phi3":  # llama.cpp keeps Phi-3's fused matrices (gate and up in ffn_up)
        for layer in range(config["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            kind = gw.GGML_F32 if matrix_type is None else matrix_type
            w.add_tensor(f"blk.{layer}.attn_qkv.weight",
                         weights.pop(p + "self_attn.qkv_proj.weight").astype(np.float32), kind)
            w.add_tensor(f"blk.{layer}.ffn_up.weight",
                         weights.pop(p + "mlp.gate_up_proj.weight").astype(np.float32), kind)
    for layer in range(config["num_hidden_layers"]):
        for name, x in weights.items():
            prefix = f"model.layers.{layer}."
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix):]
            stem, kind = rest.rsplit(".", 1)
            names = {**GGUF_LAYER, **GEMMA_NORMS} if arch in ("gemma2", "gemma3") else \
                {**GGUF_LAYER, **OLMO2_NORMS} if arch == "olmo2" else GGUF_LAYER
            target = names.get(rest) or f"{names[stem]}.{kind}"
            x = x.astype(np.float32)
            if rest.endswith("norm.weight"):
                x = x + offset
            if arch in ("llama", "granite", "smollm3") and stem in ("self_attn.q_proj", "self_attn.k_proj"):
                x = llama_cpp_permute(x, heads if stem == "self_attn.q_proj" else kv_heads)
            w.add_tensor(f"blk.{layer}.{target}", x)
    w.write(path)


@pytest.mark.parametrize("case", GGUF_CASES)
def test_a_gguf_as_llama_cpp_writes_it_matches_transformers(case, tmp_path):
    path = tmp_path / f"{case}.gguf"
    write_gguf(case, path)
    model = ReferenceModel(*load_model(str(path)))
    for ids, logits in expected(case):
        assert_close(model.forward(ids, model.new_cache(len(ids))), logits, f"{case} GGUF")
    llm = LLM(str(path), backend="cpu", block_size=4, max_num_batched_tokens=16,
              kv_cache_dtype="float32")
    params = SamplingParams(max_tokens=1, prompt_logprobs=20, temperature=0)
    for out, (ids, logits) in zip(llm.generate([ids.tolist() for ids, _ in expected(case)], params),
                                  expected(case)):
        wanted = log_softmax(logits)
        for t, entry in enumerate(out.prompt_token_logprobs[1:], start=1):
            got = dict(entry.top) | {entry.token_id: entry.logprob}
            assert_close(np.array(list(got.values())), wanted[t - 1, list(got)],
                         f"{case} GGUF position {t}")
    llm.close()


@pytest.mark.cuda
@pytest.mark.parametrize("case", [c for c in CASES if not c.endswith("-gguf")])
def test_the_cuda_backend_matches_transformers_at_every_prompt_position(case, tmp_path):
    """On a GPU, or the simulator without one: float32 weights; the short prompt, or
    for a model with a window, the long one. (The -gguf fixtures differ from their
    family's only in the settings llama.cpp fixes: nothing new for the kernels.)"""
    llm = LLM(model_folder(case, "config.json", tmp_path), backend="cuda", block_size=4,
              num_blocks=80, gpu_weight_dtype="float32", kv_cache_dtype="float32")
    ids, logits = expected(case)[0 if window_of(case) is None else 1]  # past the window
    out = llm.generate([ids.tolist()], SamplingParams(max_tokens=1, prompt_logprobs=5))[0]
    wanted = log_softmax(logits)
    for t, entry in enumerate(out.prompt_token_logprobs[1:], start=1):
        got = dict(entry.top) | {entry.token_id: entry.logprob}
        assert_close(np.array(list(got.values())), wanted[t - 1, list(got)], f"{case} position {t}")
    llm.close()


@pytest.mark.parametrize("case, backend, prompt_len, new_tokens", [
    ("mistral-window", "cpu", 40, 40), ("phi3-window", "cpu", 40, 40), ("gemma3", "cpu", 40, 40),
    ("gemma2", "cpu", 40, 24),
    # (the CUDA simulator takes seconds a step: 12 tokens and 8 new ones still slide the
    # window of 8 past whole blocks)
    pytest.param("mistral-window", "cuda", 12, 8, marks=pytest.mark.cuda),
    pytest.param("gemma3", "cuda", 12, 8, marks=pytest.mark.cuda)])
def test_blocks_behind_a_window_go_back_to_the_pool(case, backend, prompt_len, new_tokens, tmp_path,
                                                    monkeypatch):
    """Sliding layers (window 8, blocks of 4): while a sequence decodes, the blocks
    wholly behind its window return to the pool in every sliding KV group; global
    layers' groups (Gemma 2 and 3 mix both) keep every block. The pool then holds
    exactly KVGroups.blocks_held blocks at each decode step, and the tokens are still
    the dense reference's (which masks the window, and matches transformers above)."""
    from helpers import dense_greedy
    from tinypaged.model.kv_groups import blocks_for

    folder = model_folder(case, "config.json", tmp_path)
    llm = LLM(folder, backend=backend, block_size=4, num_blocks=48, gpu_weight_dtype="float32",
              kv_cache_dtype="float32")
    bm, groups = llm.engine.block_manager, llm.engine.runner.model.kv_groups
    assert 8 in bm.windows and bm.windows == groups.windows
    decode_steps = []  # (tokens of the sequence, blocks in use) at each decode step
    schedule = llm.engine.scheduler.schedule

    def recording_schedule():
        plan = schedule()
        if plan.batch.decodes:
            decode_steps.append((len(plan.batch.decodes[0]), bm.num_blocks - bm.num_free_blocks))
        return plan
    monkeypatch.setattr(llm.engine.scheduler, "schedule", recording_schedule)
    prompt = expected(case)[1][0].tolist()[:prompt_len]
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    out = llm.generate([prompt], params)[0]
    want = dense_greedy(ReferenceModel(*load_model(folder)), prompt, new_tokens)
    assert out.outputs[0].token_ids == want
    assert len(decode_steps) == new_tokens - 1
    for tokens, used in decode_steps:
        assert used == groups.blocks_held(tokens, 4), (tokens, used)
        sliding = sum(w is not None for w in groups.windows)
        assert used <= (groups.num_groups - sliding) * blocks_for(tokens, 4) + sliding * 3
    assert llm.stats()["blocks_used"] == 0
    llm.close()


def test_phi3s_packed_fused_matrices_split_into_packed_rows(tmp_path):
    """A Q8_0 attn_qkv and ffn_up (as a quantized Phi-3 GGUF holds them) split into
    packed q/k/v and gate/up, and the engine runs them as the reference does."""
    import gguf_writer as gw
    from helpers import dense_greedy
    from tinypaged.formats.packed import PackedWeight

    path = tmp_path / "phi3-q8.gguf"
    write_gguf("phi3", path, gw.GGML_Q8_0)
    cfg, weights = load_model(str(path))
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    assert isinstance(q, PackedWeight) and q.shape == (cfg.q_size, cfg.hidden_size)
    assert weights["model.layers.0.mlp.up_proj.weight"].shape == (cfg.intermediate_size, cfg.hidden_size)
    prompt = expected("phi3")[0][0].tolist()
    llm = LLM(str(path), backend="cpu")
    got = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    assert got.outputs[0].token_ids == dense_greedy(ReferenceModel(cfg, weights), prompt, 8)


@pytest.mark.cuda
def test_replayed_decode_steps_read_every_kv_groups_tables(tmp_path):
    """Gemma 3's fixture has three KV groups (two sliding, one global): a recorded
    decode step takes each group's tables and slots from its fixed buffer, and gives
    the eager step's logits bit for bit while the sliding groups release blocks."""
    from tinypaged.config import EngineConfig
    from tinypaged.engine.llm_engine import LLMEngine

    folder = model_folder("gemma3", "config.json", tmp_path)
    runs = {}
    for cuda_graphs in (False, True):
        engine = LLMEngine(folder, EngineConfig(backend="cuda", block_size=4, num_blocks=40,
                                                gpu_weight_dtype="float32",
                                                cuda_graphs=cuda_graphs))
        assert engine.block_manager.num_groups == 3
        logits, run = [], engine.runner.forward

        def recorded_run(batch, rows=None, needs=None, pooled=None, run=run, logits=logits):
            out = run(batch, rows, needs, pooled)
            logits.append(np.array(out.rows(list(range(len(out))))))
            return out
        engine.runner.forward = recorded_run
        released, release = [], engine.block_manager.release_behind
        engine.block_manager.release_behind = lambda seq: released.append(release(seq)) or released[-1]
        # 10 prompt tokens and 5 more: blocks of 4 behind a window of 8 go from position 12
        engine.add_request(list(range(3, 13)), SamplingParams(temperature=0, max_tokens=5,
                                                              ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        assert sum(released) == 2  # block 0 of both sliding groups, mid-run
        runs[cuda_graphs] = logits, engine
    (eager, _), (replayed, engine) = runs[False], runs[True]
    assert engine.runner.model.ops.launcher.replays >= 3
    assert engine.block_manager.num_free_blocks == 40 and len(eager) == len(replayed)
    for step, (got, want) in enumerate(zip(replayed, eager)):
        np.testing.assert_array_equal(got, want, err_msg=f"step {step}")

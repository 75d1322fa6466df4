"""The whole engine on the CUDA backend: the simulator without a GPU (a stand-in for
stories260K: conftest.cuda_model_dir), stories260K and real-model checks on a GPU."""
import numpy as np
import pytest
from conftest import CUDA_STAND_IN
from helpers import write_tiny_model

from tinypaged import LLM, SamplingParams
from tinypaged.kernels.cuda import cuda_usable

pytestmark = pytest.mark.cuda
GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)  # (each step on the simulator: seconds)
# at most GEMV_MAX_ROWS tokens (stories260K: 6, its BOS first; the stand-in's: 5), as the
# decode steps: the simulator's tiled products are held in test_cuda_kernels.py and in
# the ten-row test at the end
PROMPT = "A tale"
REPEATING = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]  # (a prompt that repeats itself: proposals are made)


def test_greedy_generation_matches_the_cpu_backend(cuda_model_dir):
    """Float32 weights and KV pool; then float16 weights with a float16 KV pool on both
    backends (K/V rounded alike when written)."""
    prompt = PROMPT
    for weight_dtype, kv_dtype in (("float32", "float32"), ("float16", "float16")):
        cpu = LLM(cuda_model_dir, backend="cpu", num_blocks=16,
                  kv_cache_dtype=kv_dtype).generate(prompt, GREEDY)[0]
        gpu_llm = LLM(cuda_model_dir, backend="cuda", num_blocks=16, gpu_weight_dtype=weight_dtype,
                      kv_cache_dtype=kv_dtype)
        assert gpu_llm.engine.backend_name == "cuda"
        gpu = gpu_llm.generate(prompt, GREEDY)[0]
        assert len(gpu.token_ids) == 5
        assert gpu.token_ids == cpu.token_ids, (weight_dtype, gpu.text, cpu.text)


def test_a_packed_model_runs_on_the_gpu_packed(cuda_model_dir):
    """quantization= (or a GGUF) gives packed matrices; the CUDA backend keeps them
    packed (DevicePacked) and both backends round x for them, so the greedy texts
    agree. Q4_1, the default GGUF's type (a down_proj of 172 or 96 columns stays float)."""
    from tinypaged.kernels.cuda.device_weights import DevicePacked
    prompt = PROMPT
    cpu = LLM(cuda_model_dir, backend="cpu", num_blocks=16, quantization="q4_1").generate(prompt, GREEDY)[0]
    gpu_llm = LLM(cuda_model_dir, backend="cuda", num_blocks=16, quantization="q4_1",
                  gpu_weight_dtype="float32")
    assert isinstance(gpu_llm.engine.runner.model.w["model.layers.0.self_attn.q_proj.weight"],
                      DevicePacked)
    gpu = gpu_llm.generate(prompt, GREEDY)[0]
    assert len(gpu.token_ids) == 5 and gpu.token_ids == cpu.token_ids


def test_a_batch_1_decode_step_launches_at_most_10_kernels_per_layer(stories_dir):
    llm = LLM(stories_dir, backend="cuda", num_blocks=16)
    engine, ops = llm.engine, llm.engine.runner.model.ops
    engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=3))
    engine.step()  # prefill
    before = ops.launcher.launches
    engine.step()  # one decode step
    per_layer = (ops.launcher.launches - before) / llm.config.num_hidden_layers
    assert per_layer <= 10, per_layer  # 8 per layer + 5 per step here


def test_asking_for_cuda_without_a_gpu_is_a_clear_error(tmp_path, monkeypatch):
    if cuda_usable():
        pytest.skip("a GPU is present")
    import tinypaged.kernels.cuda as cuda_pkg
    monkeypatch.setattr(cuda_pkg, "cuda_simulated", lambda: False)
    from tinypaged.kernels import get_backend
    with pytest.raises(ValueError, match="backend='cuda' needs an NVIDIA GPU"):
        get_backend("cuda")
    assert get_backend("auto").name == "cpu"


needs_gpu = pytest.mark.skipif(not cuda_usable(), reason="needs a GPU (bench/gpu_check.py runs it there)")


@needs_gpu
def test_smollm2_on_the_gpu_equals_the_cpu_backend(smollm2_dir):
    from test_smollm2_engine import QUESTIONS
    cpu_llm = LLM(smollm2_dir, backend="cpu", kv_cache_memory=256 << 20)
    prompts = [cpu_llm.chat_prompt([{"role": "user", "content": q}]) for q in QUESTIONS]
    params = SamplingParams(temperature=0, max_tokens=16)
    want = [o.token_ids for o in cpu_llm.generate(prompts, params)]
    gpu_llm = LLM(smollm2_dir, backend="cuda", kv_cache_memory=256 << 20)
    got = [o.token_ids for o in gpu_llm.generate(prompts, params)]
    assert got == want
    assert gpu_llm.stats()["prefix_cache_hit_tokens"] > 0


@needs_gpu
def test_preemption_under_pressure_on_the_gpu(smollm2_dir):
    prompts = [f"Tell me a fact about the number {i}." for i in range(32)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    roomy = LLM(smollm2_dir, backend="cuda", kv_cache_memory=512 << 20).generate(prompts, params)
    tight_llm = LLM(smollm2_dir, backend="cuda", num_blocks=40)
    tight = tight_llm.generate(prompts, params)
    assert [o.token_ids for o in tight] == [o.token_ids for o in roomy]
    assert tight_llm.stats()["preemptions"] > 0


def test_the_engine_thread_selects_the_backends_device(cuda_model_dir, monkeypatch):
    """numba gives a new thread device 0: the loop thread selects the device the
    weights and the pool were put on before its first step, and the thread that
    loads the weights selects the same one (B6)."""
    import threading

    from numba import cuda

    selected = []
    real_select = cuda.select_device

    def select_device(device_id):
        selected.append((threading.current_thread().name, device_id))
        return real_select(device_id)
    monkeypatch.setattr(cuda, "select_device", select_device)
    with LLM(cuda_model_dir, backend="cuda", num_blocks=16) as llm:
        device = llm.engine.runner.model.ops.device_id
        assert llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=3))[0].finished
    threads = [name for name, _ in selected]
    assert {d for _, d in selected} == {device}
    assert threads[0] == "tinypaged-load" and "tinypaged-engine-loop" in threads


def test_samples_take_candidates_found_on_the_device_and_draw_what_whole_rows_draw(cuda_model_dir):
    """A greedy or small-top-k sample needs a few candidates, not its whole row
    (stories260K: 512 floats, SmolLM2: 49,152): found on the device, they are all that comes back, and the
    tokens are those the whole rows give, seeded draws included (B7)."""
    params = [SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
              SamplingParams(temperature=1.0, top_k=5, top_p=0.9, seed=3, max_tokens=2,
                             ignore_eos=True, n=2),
              SamplingParams(temperature=0.7, top_k=40, min_p=0.05, seed=4, max_tokens=2,
                             ignore_eos=True)]
    prompts = [PROMPT, "The dog", "A girl"]
    runs = {}
    for reduce in (True, False):
        with LLM(cuda_model_dir, backend="cuda", num_blocks=32) as llm:
            vocab = llm.config.vocab_size
            ops = llm.engine.runner.model.ops
            ops.reduce_logits = reduce
            outs = llm.generate(prompts, params)
            runs[reduce] = [[o.token_ids for o in out.outputs] for out in outs], ops.launcher.bytes_to_host
    (reduced, reduced_bytes), (whole, whole_bytes) = runs[True], runs[False]
    assert reduced == whole
    # rows: 3 in the prefill step (the two samples of the second prompt share its row),
    # then 4 in the decode step
    rows = 3 + 4
    assert whole_bytes >= rows * vocab * 4  # every sample's row, every step
    # candidates alone: (value, id) pairs, as many a row as the step's largest top_k + 1
    # (a fifth of whole rows of 512, a third of the stand-in's 262)
    assert reduced_bytes <= rows * 41 * 2 * 4 < whole_bytes / (5 if vocab >= 512 else 3)


def test_an_int8_kv_cache_on_the_gpu_generates_the_cpu_backends_tokens(tmp_path):
    """kv_cache_dtype="int8" (kv_q8.py's rows) on both backends: K/V quantized alike when
    written, read alike; a model whose heads are 32 wide (a scale per head and token)."""
    write_tiny_model(str(tmp_path), **{**CUDA_STAND_IN, "num_attention_heads": 2,
                                       "num_key_value_heads": 1})
    cpu = LLM(tmp_path, backend="cpu", num_blocks=16, kv_cache_dtype="int8").generate(PROMPT, GREEDY)[0]
    with LLM(tmp_path, backend="cuda", num_blocks=16, kv_cache_dtype="int8",
             gpu_weight_dtype="float32") as llm:
        assert llm.engine.runner.kv.dtype == np.int8
        gpu = llm.generate(PROMPT, GREEDY)[0]
    assert len(gpu.token_ids) == 5
    assert gpu.token_ids == cpu.token_ids, (gpu.text, cpu.text)


def test_a_head_wider_than_the_kernels_take_is_refused_when_the_pool_is_made(tmp_path):
    write_tiny_model(str(tmp_path), **{**CUDA_STAND_IN, "hidden_size": 256, "num_attention_heads": 1,
                                       "num_key_value_heads": 1})
    with pytest.raises(ValueError, match="head_dim=256 exceeds the CUDA kernels' MAX_HEAD_DIM=128"):
        LLM(tmp_path, backend="cuda", num_blocks=16)


@pytest.fixture(scope="module")
def plain_greedy(cuda_model_dir) -> list[int]:
    """REPEATING's first 8 greedy tokens on the CUDA backend without speculation (the
    speculating tests' answer; a shorter run's are its first ones)."""
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    llm = LLM(cuda_model_dir, backend="cuda", num_blocks=16)
    tokens = llm.generate([REPEATING], params)[0].token_ids
    llm.close()
    return tokens


def test_speculation_on_the_gpu_gives_plain_greedy_tokens(cuda_model_dir, monkeypatch, plain_greedy):
    """Proposals verified as decode rows on the CUDA backend (eager: a step with several
    rows for one sequence is not a recorded decode step): plain greedy's tokens."""
    from tinypaged.engine.draft_sizer import DraftSizer
    monkeypatch.setattr(DraftSizer, "choose", lambda self, rates, plain: [self.sizes[-1]] * len(rates))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    llm = LLM(cuda_model_dir, backend="cuda", num_blocks=16,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    got = llm.generate([REPEATING], params)[0]
    assert got.token_ids == plain_greedy[:6]
    stats = llm.stats()
    assert stats["spec_num_draft_tokens"] > 0 and stats["blocks_used"] == 0


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_a_draft_model_speculates_on_the_gpu(cuda_model_dir, monkeypatch, cuda_graphs, plain_greedy):
    """A draft model (the stand-in drafting for itself) on the CUDA backend: its own
    device KV pool, its passes through the same kernels; plain greedy's tokens. The
    verification runs eagerly or as a recorded decode step (a bucket of rows, several of
    them one sequence's: recorded once, then replayed)."""
    from tinypaged.engine.draft_sizer import DraftSizer
    monkeypatch.setattr(DraftSizer, "choose", lambda self, rates, plain: [self.sizes[-1]] * len(rates))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    llm = LLM(cuda_model_dir, backend="cuda", num_blocks=16, max_num_seqs=1, cuda_graphs=cuda_graphs,
              speculative_config={"method": "draft_model", "model": str(cuda_model_dir),
                                  "num_speculative_tokens": 2})
    got = llm.generate([REPEATING], params)[0]
    assert got.token_ids == plain_greedy
    assert llm.stats()["spec_num_accepted_tokens"] > 0
    graphs = llm.engine.runner.decode_graphs
    if cuda_graphs:  # (1 + 2 rows: bucket 4; tokens 2-4 and 5-7 take two such steps)
        assert graphs.buckets[-1] == 4 and 4 in {bucket for bucket, _ in graphs.steps}
        assert llm.engine.runner.model.ops.launcher.replays > 0
    else:
        assert graphs is None


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_ten_rows_run_the_tiled_kernels_and_generate_the_cpu_backends_tokens(cuda_model_dir, cuda_graphs):
    """Ten requests at once: their prompts' 49 rows in one step and then each decode
    step's ten rows go through the tiled products (q | k | v and gate/up fused, K split
    where the tiles are few) and the prefill attention's tiles; greedy tokens as the CPU
    backend's, eager and as recorded steps (bucket 16)."""
    prompts = [[1] + list(range(3 + 7 * i, 6 + 7 * i + i % 3)) for i in range(10)]  # 4-6 tokens
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    cpu = LLM(cuda_model_dir, backend="cpu", num_blocks=32).generate(prompts, params)
    gpu_llm = LLM(cuda_model_dir, backend="cuda", num_blocks=32, cuda_graphs=cuda_graphs)
    gpu = gpu_llm.generate(prompts, params)
    assert [o.token_ids for o in gpu] == [o.token_ids for o in cpu]
    if cuda_graphs:
        assert 16 in {bucket for bucket, _ in gpu_llm.engine.runner.decode_graphs.steps}

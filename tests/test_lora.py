"""LoRA adapters against PEFT: the engine with an adapter gives the logits of PEFT's
merged model at every position (tools/make_lora_fixtures.py; Llama and Qwen3, r 4
and 16, with and without rsLoRA, rank and alpha patterns), over a float folder, a
GGUF file and a quantized base, on the CPU and the CUDA backend (the simulator here).
A batch mixing adapters and the base gives each row what it gets alone; no block is
shared across adapters; bad adapters are refused by name and the engine goes on;
unloading under load loses no request."""
import json
import os
import shutil

import numpy as np
import pytest

from test_hf_parity import RTOL, log_softmax, model_folder, write_gguf
from tinypaged import LLM, LoRARequest, SamplingParams
from tinypaged.kernels import reference
from tinypaged.kernels.cpu.lora import add_lora, lora_groups, lora_stacks, upload
from tinypaged.model.lora_adapter import SHARED_INPUTS
from tinypaged.model.lora_slots import slot_major

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "lora")
CASES = sorted(os.listdir(FIXTURES))
PROMPT_LOGPROBS = SamplingParams(max_tokens=1, prompt_logprobs=20, temperature=0)


def fixture(case: str) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """[(prompt ids, PEFT's merged logits, the base's logits)] of a case."""
    data = np.load(os.path.join(FIXTURES, case, "logits.npz"))
    return [(data[f"prompt_{i}"], data[f"logits_{i}"], data[f"base_{i}"])
            for i in range(len(data.files) // 3)]


def base_of(case: str) -> str:
    return case.split("-")[0]


def engine(model: str, **options) -> LLM:
    """Adapters held as PEFT saves them (float32; a float16 model's default would
    round them to float16: test_float16_adapters_...)."""
    options = {"backend": "cpu", "block_size": 4, "kv_cache_dtype": "float32",
               "max_num_batched_tokens": 16, "lora_dtype": "float32", **options}
    return LLM(model, **options)


def prompt_error(out, ids: np.ndarray, logits: np.ndarray) -> float:
    """The largest difference between out's prompt logprobs (each position's token and
    top 20) and those of logits."""
    wanted, worst = log_softmax(logits), 0.0
    for t, entry in enumerate(out.prompt_token_logprobs[1:], start=1):
        assert entry.token_id == ids[t]
        got = dict(entry.top) | {entry.token_id: entry.logprob}
        tokens = list(got)
        worst = max(worst, float(np.abs(np.array([got[k] for k in tokens]) - wanted[t - 1, tokens]).max()))
    return worst


def assert_prompt_logits(out, ids: np.ndarray, logits: np.ndarray, what: str):
    """out's prompt logprobs within test_hf_parity's bound of logits' at every position."""
    spread = float(np.ptp(log_softmax(logits)))
    error = prompt_error(out, ids, logits)
    assert error <= RTOL * spread, f"{what}: off by {error:.3g} (bound {RTOL * spread:.3g})"


@pytest.mark.parametrize("case", CASES)
def test_an_adapter_gives_pefts_merged_logits_at_every_position(case, tmp_path):
    llm = engine(model_folder(base_of(case), "config.json", tmp_path),
                 lora_modules={"tuned": os.path.join(FIXTURES, case)})
    for ids, merged, base in fixture(case):
        tuned, plain = llm.generate([ids.tolist()] * 2, PROMPT_LOGPROBS, lora=["tuned", None])
        assert_prompt_logits(tuned, ids, merged, f"{case} with the adapter")
        assert_prompt_logits(plain, ids, base, f"{case} without it")  # (the same batch)
    llm.close()


@pytest.mark.parametrize("backend", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_float16_adapters_stay_within_their_rounding_of_pefts_logits(backend, tmp_path):
    """A float16 model holds its adapters in float16 by default (half the bytes each
    step streams): A and B rounded to float16 move these strong adapters' logits by up
    to 2e-4 of their spread; the bound is 5e-4, and a dropped term moves them 0.2."""
    case = "llama-r16-rslora"
    llm = engine(model_folder(base_of(case), "config.json", tmp_path), backend=backend, num_blocks=64,
                 lora_dtype="auto", lora_modules={"tuned": os.path.join(FIXTURES, case)})
    assert llm.engine.loras.slots.dtype == np.float16
    for ids, merged, _ in fixture(case)[:1 if backend == "cuda" else 2]:
        out = llm.generate([ids.tolist()], PROMPT_LOGPROBS, lora="tuned")[0]
        assert prompt_error(out, ids, merged) <= 5e-4 * np.ptp(log_softmax(merged))
    llm.close()


def test_an_adapter_over_a_gguf_base(tmp_path):
    case = "llama-r16-rslora"
    path = tmp_path / "llama.gguf"
    write_gguf("llama", path)  # (Q and K rows permuted as llama.cpp stores them)
    llm = engine(str(path), lora_modules={"tuned": os.path.join(FIXTURES, case)})
    for ids, merged, _ in fixture(case):
        assert_prompt_logits(llm.generate([ids.tolist()], PROMPT_LOGPROBS, lora="tuned")[0], ids,
                             merged, f"{case} over GGUF")
    llm.close()


def test_an_adapter_over_a_quantized_base_moves_the_logits_as_peft_does(tmp_path):
    """Q8_0 products: the base's own rounding bounds the error (0.1-0.25 here); the
    adapter moves the logits ten times that, so a dropped term still fails."""
    case = "qwen3-r16"
    llm = engine(model_folder("qwen3", "config.json", tmp_path), quantization="q8_0",
                 lora_modules={"tuned": os.path.join(FIXTURES, case)})
    for ids, merged, base in fixture(case):
        tuned, plain = llm.generate([ids.tolist()] * 2, PROMPT_LOGPROBS, lora=["tuned", None])
        rounding = prompt_error(plain, ids, base)
        assert prompt_error(tuned, ids, merged) <= 2 * rounding
        assert prompt_error(tuned, ids, base) > 8 * rounding
    llm.close()


@pytest.mark.cuda
def test_the_cuda_backend_runs_adapters_as_peft_does(tmp_path):
    case = "qwen3-r4-rslora"
    llm = engine(model_folder(base_of(case), "config.json", tmp_path), backend="cuda", num_blocks=64,
                 gpu_weight_dtype="float32", lora_modules={"tuned": os.path.join(FIXTURES, case)})
    ids, merged, base = fixture(case)[0]
    tuned, plain = llm.generate([ids.tolist()] * 2, PROMPT_LOGPROBS, lora=["tuned", None])
    assert_prompt_logits(tuned, ids, merged, f"{case} on CUDA")
    assert_prompt_logits(plain, ids, base, f"{case} on CUDA, the base")
    llm.close()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_the_cpu_kernel_matches_the_reference_on_random_terms(dtype):
    """Two products sharing their input, one of them the right columns of a wider
    array (the MLP's up half), three slots of which one leaves a product alone."""
    rng = np.random.default_rng()
    slots, max_rank, n_in, rows = 3, 8, 40, 9
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    wide = rng.standard_normal((rows, 2 * 24)).astype(np.float32)
    ys = [rng.standard_normal((rows, 37)).astype(np.float32), wide[:, 24:]]  # (IR: 16 at a time, the rest after)
    region, views = slot_major(slots, [(max_rank, n) for y in ys for n in (n_in, y.shape[1])], dtype)
    terms = []
    for y, ranks, a, bt in zip(ys, (np.array([8, 0, 3], np.int32), np.array([5, 2, 0], np.int32)),
                               views[::2], views[1::2]):
        a[...] = rng.standard_normal(a.shape)
        bt[...] = rng.standard_normal(bt.shape)
        for s, r in enumerate(ranks):  # (zero past each rank, as LoRASlots keeps them)
            a[s, r:], bt[s, r:] = 0, 0
        scales = rng.uniform(0.5, 4, slots).astype(np.float32)
        terms.append((y, a, bt, ranks, scales))  # (float16 widened: the spec's)
    adapted = np.array([5, 0, 7, 2, 8, 3], np.int32)
    slot_of = np.array([0, 0, 1, 2, 2, 2], np.int32)
    wants = [y.astype(np.float64) for y in ys]
    reference.add_lora(x.astype(np.float64), wants, reference.lora_stacks(
        [(a.astype(np.float64), bt.astype(np.float64), r, sc.astype(np.float64)) for _, a, bt, r, sc in terms]),
        adapted, slot_of)
    before = [y.copy() for y in ys]
    left_half = wide[:, :24].copy()
    add_lora(x, tuple(ys), lora_stacks([(upload(a), upload(bt), r, sc) for _, a, bt, r, sc in terms], region),
             *lora_groups(adapted, slot_of))
    for got, want, old in zip(ys, wants, before):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(wide[:, :24], left_half)  # (the other half untouched)
    base_rows = [r for r in range(rows) if r not in adapted]
    np.testing.assert_array_equal(ys[0][base_rows], before[0][base_rows])


@pytest.fixture(scope="module")
def two_adapters(tmp_path_factory):
    """Qwen3 with two adapters loaded: "a" (r 16) and "b" (r 4, rsLoRA, patterns)."""
    folder = model_folder("qwen3", "config.json", tmp_path_factory.mktemp("qwen3"))
    llm = engine(folder, lora_modules={"a": os.path.join(FIXTURES, "qwen3-r16"),
                                       "b": os.path.join(FIXTURES, "qwen3-r4-rslora")},
                 max_loras=3)
    yield llm
    llm.close()


def test_a_batch_mixing_adapters_and_the_base_equals_each_alone_bit_for_bit(tmp_path):
    """Each row of a mixed batch equals, bit for bit, the same row of the same batch in
    which every row runs its adapter: a row's terms do not depend on its neighbours'
    adapters. (A batch of another size may round the base's products otherwise, so
    each request run alone gives the same tokens, and logprobs within float32 sums.)"""
    llm = engine(model_folder("qwen3", "config.json", tmp_path), enable_prefix_caching=False,
                 lora_modules={"a": os.path.join(FIXTURES, "qwen3-r16"),
                               "b": os.path.join(FIXTURES, "qwen3-r4-rslora")})
    prompts = [list(range(3, 3 + n)) for n in (7, 13, 5, 9)]
    params = SamplingParams(max_tokens=12, temperature=0, logprobs=5, ignore_eos=True)
    assignment = ["a", "b", None, "a"]

    def run(prompts, lora):
        return [(o.outputs[0].token_ids, [e.logprob for e in o.outputs[0].token_logprobs])
                for o in llm.generate(prompts, params, lora=lora)]
    mixed = run(prompts, assignment)
    for lora in set(assignment):
        uniform = run(prompts, lora)
        for i in range(len(prompts)):
            if assignment[i] == lora:
                assert mixed[i] == uniform[i], f"row {i} ({lora!r}) changed with its neighbours"
    for prompt, lora, (tokens, logprobs) in zip(prompts, assignment, mixed):
        alone_tokens, alone_logprobs = run([prompt], lora)[0]
        assert alone_tokens == tokens
        assert alone_logprobs == pytest.approx(logprobs, abs=1e-5)
    assert len({tuple(run([prompts[0]], lora)[0][0]) for lora in ("a", "b", None)}) == 3
    llm.close()


def test_no_block_is_shared_across_adapters(two_adapters):
    llm = two_adapters
    prompt = list(range(20, 45))  # six full blocks of 4
    params = SamplingParams(max_tokens=3, temperature=0, logprobs=3, ignore_eos=True)
    hits = lambda: llm.stats()["prefix_cache_hit_tokens"]  # noqa: E731
    first = {}
    for lora in (None, "a", "b"):  # each one's first run finds nothing to share
        before = hits()
        first[lora] = llm.generate([prompt], params, lora=lora)[0]
        assert hits() == before, f"adapter {lora!r} took another's blocks"
    for lora in (None, "a", "b"):  # the second run of each takes its own blocks
        before = hits()
        again = llm.generate([prompt], params, lora=lora)[0]
        assert hits() - before == 24
        assert again.outputs[0].token_ids == first[lora].outputs[0].token_ids
        assert [e.logprob for e in again.outputs[0].token_logprobs] == \
            pytest.approx([e.logprob for e in first[lora].outputs[0].token_logprobs], abs=1e-5)
    assert len({first[lora].outputs[0].token_logprobs[0].logprob for lora in first}) == 3


def test_parallel_samples_and_speculation_keep_their_adapter(tmp_path):
    case = "qwen3-r16"
    folder = model_folder("qwen3", "config.json", tmp_path)
    lora = {"tuned": os.path.join(FIXTURES, case)}
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    plain = engine(folder, lora_modules=lora)
    want = plain.generate([prompt], greedy, lora="tuned")[0].outputs[0].token_ids
    samples = plain.generate([prompt], SamplingParams(n=3, max_tokens=16, temperature=0, ignore_eos=True),
                             lora="tuned")[0].outputs
    assert [s.token_ids for s in samples] == [want] * 3  # (forks run the adapter too)
    plain.close()
    speculating = engine(folder, lora_modules=lora, speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
    assert speculating.generate([prompt], greedy, lora="tuned")[0].outputs[0].token_ids == want
    speculating.close()


# -- what is refused ------------------------------------------------------------------------

def adapter_copy(tmp_path, case: str, config_changes: dict | None = None, tensors=None):
    """A copy of a fixture adapter with its config changed, or its tensors replaced
    (tensors(dict) -> dict)."""
    from tinypaged.formats.safetensors_io import read_safetensors
    from helpers import write_safetensors
    folder = tmp_path / f"{case}-changed-{len(os.listdir(tmp_path))}"
    shutil.copytree(os.path.join(FIXTURES, case), folder)
    if config_changes:
        config = json.loads((folder / "adapter_config.json").read_text())
        (folder / "adapter_config.json").write_text(json.dumps({**config, **config_changes}))
    if tensors is not None:
        weights = tensors(read_safetensors(folder / "adapter_model.safetensors"))
        write_safetensors(str(folder / "adapter_model.safetensors"), weights)
    return str(folder)


def refusals(tmp_path) -> list[tuple[str, str]]:
    """(adapter folder, words its refusal must hold), for the qwen3 base."""
    attn = "base_model.model.model.layers.0.self_attn."

    def renamed(old, new):
        return lambda t: {k.replace(old, new): v for k, v in t.items()}

    def wrong_rows(t):
        t[attn + "q_proj.lora_B.weight"] = np.zeros((48, 16), np.float32)
        return t

    def extra(name):
        return lambda t: {**t, name: np.zeros((4, 4), np.float32)}
    return [
        (os.path.join(FIXTURES, "llama-r4"), "made for LlamaForCausalLM"),
        (adapter_copy(tmp_path, "qwen3-r16", tensors=wrong_rows), "do not fit the model's q_proj"),
        (adapter_copy(tmp_path, "qwen3-r16", tensors=renamed("self_attn.q_proj", "self_attn.qkv")),
         "does not adapt"),
        (adapter_copy(tmp_path, "qwen3-r16", tensors=extra("base_model.model.lm_head.lora_A.weight")),
         "the lm_head"),
        (adapter_copy(tmp_path, "qwen3-r16",
                      tensors=extra("base_model.model.model.embed_tokens.lora_embedding_A")),
         "the embedding"),
        (adapter_copy(tmp_path, "qwen3-r16", tensors=renamed("layers.1.", "layers.7.")),
         "is for layer 7"),
        (adapter_copy(tmp_path, "qwen3-r16", {"use_dora": True}), "use_dora=True"),
        (adapter_copy(tmp_path, "qwen3-r16", {"bias": "all"}), "bias='all'"),
        (adapter_copy(tmp_path, "qwen3-r16", {"modules_to_save": ["lm_head"]}), "modules_to_save"),
        (adapter_copy(tmp_path, "qwen3-r16", {"r": 8}), "says r=8"),
        (adapter_copy(tmp_path, "qwen3-r16", {"peft_type": "IA3"}), "IA3 adapter"),
        (str(tmp_path), "no adapter_config.json"),
    ]


def test_bad_adapters_are_refused_by_name_and_the_engine_goes_on(two_adapters, tmp_path):
    llm = two_adapters
    prompt, params = [5, 6, 7], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    before = llm.generate([prompt] * 2, params, lora=["a", None])
    for path, words in refusals(tmp_path):
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace("[", r"\[")):
            llm.load_lora("bad", path)
    (tmp_path / "small").mkdir()
    with pytest.raises(ValueError, match="rank 16.*max_lora_rank is 8"):
        engine(model_folder("qwen3", "config.json", tmp_path / "small"),
               max_lora_rank=8, lora_modules={"big": os.path.join(FIXTURES, "qwen3-r16")})
    with pytest.raises(ValueError, match="already loaded"):
        llm.load_lora("a", os.path.join(FIXTURES, "qwen3-r16"))
    with pytest.raises(ValueError, match="no LoRA adapter named 'nope' is loaded"):
        llm.generate([prompt], params, lora="nope")
    with pytest.raises(KeyError, match="nope"):
        llm.unload_lora("nope")
    assert llm.list_loras().keys() == {"a", "b"}
    after = llm.generate([prompt] * 2, params, lora=["a", None])
    assert [o.outputs[0].token_ids for o in after] == [o.outputs[0].token_ids for o in before]


def test_adapters_need_lora_enabled_and_a_slot(tmp_path):
    folder = model_folder("qwen3", "config.json", tmp_path)
    llm = engine(folder)
    with pytest.raises(ValueError, match="enable_lora=True"):
        llm.load_lora("a", os.path.join(FIXTURES, "qwen3-r16"))
    llm.close()
    llm = engine(folder, enable_lora=True, max_loras=1)
    llm.load_lora("a", os.path.join(FIXTURES, "qwen3-r16"))
    with pytest.raises(ValueError, match="max_loras=1"):
        llm.load_lora("b", os.path.join(FIXTURES, "qwen3-r4-rslora"))
    llm.unload_lora("a")
    llm.load_lora("b", os.path.join(FIXTURES, "qwen3-r4-rslora"))  # (the slot is free again)
    llm.close()
    with pytest.raises(ValueError, match="lora_modules names 2 adapters; max_loras is 1"):
        engine(folder, max_loras=1, lora_modules={"a": os.path.join(FIXTURES, "qwen3-r16"),
                                                  "b": os.path.join(FIXTURES, "qwen3-r4-rslora")})


def test_vllms_lora_request_loads_the_adapter_on_first_use(tmp_path):
    case = "qwen3-r16"
    llm = engine(model_folder("qwen3", "config.json", tmp_path), enable_lora=True)
    ids, merged, _ = fixture(case)[0]
    request = LoRARequest("tuned", 1, os.path.join(FIXTURES, case))
    for _ in range(2):  # (loaded the first time, reused the second)
        out = llm.generate([ids.tolist()], PROMPT_LOGPROBS, lora_request=request)[0]
        assert_prompt_logits(out, ids, merged, case)
    with pytest.raises(ValueError, match="is loaded from"):
        llm.generate([ids.tolist()], PROMPT_LOGPROBS,
                     lora_request=LoRARequest("tuned", 1, os.path.join(FIXTURES, "qwen3-r4-rslora")))
    llm.close()


def test_unloading_under_load_loses_no_request(tmp_path):
    """Requests of adapter a run while a is unloaded and another adapter takes a free
    slot: every one finishes with a's tokens; a request that names a after the unload
    is refused; a's slot is not reused while its requests run."""
    folder = model_folder("qwen3", "config.json", tmp_path)
    llm = engine(folder, lora_modules={"a": os.path.join(FIXTURES, "qwen3-r16")}, max_loras=2)
    prompts = [[3 + i, 9, 11 + i, 4] for i in range(6)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, params, lora="a")]
    base = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    handles = [llm.submit(p, params, lora="a") for p in prompts]
    others = [llm.submit(p, params) for p in prompts]
    llm.unload_lora("a")  # (the loop takes the adds first: the inbox keeps their order)
    with pytest.raises(ValueError, match="no LoRA adapter named 'a'"):
        llm.submit(prompts[0], params, lora="a").result()
    llm.load_lora("b", os.path.join(FIXTURES, "qwen3-r4-rslora"))  # (the other slot)
    with pytest.raises(ValueError, match="max_loras=2 adapters are loaded \\(or still finishing"):
        llm.load_lora("c", os.path.join(FIXTURES, "qwen3-r16"))
    assert [h.result().outputs[0].token_ids for h in handles] == want
    assert [h.result().outputs[0].token_ids for h in others] == base
    llm.load_lora("c", os.path.join(FIXTURES, "qwen3-r16"))  # (a's slot, now free)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params, lora="c")] == want
    llm.close()


def test_a_freed_slot_keeps_nothing_of_its_earlier_adapter(tmp_path):
    """An adapter on q and v alone, loaded into the slot an adapter on every product
    left: the products it does not target run without the earlier one's terms (its
    outputs are those it gives in a fresh engine)."""
    folder = model_folder("qwen3", "config.json", tmp_path)
    qv = adapter_copy(tmp_path, "qwen3-r16", tensors=lambda t: {
        k: v for k, v in t.items() if ".q_proj." in k or ".v_proj." in k})
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=3, ignore_eos=True)
    prompt = [5, 6, 7, 8, 9]

    def run(llm):
        out = llm.generate([prompt], params, lora="qv")[0].outputs[0]
        return out.token_ids, [e.logprob for e in out.token_logprobs]
    fresh = engine(folder, lora_modules={"qv": qv})
    want = run(fresh)
    fresh.close()
    reused = engine(folder, max_loras=1, lora_modules={"all": os.path.join(FIXTURES, "qwen3-r16")})
    reused.generate([prompt], params, lora="all")
    reused.unload_lora("all")
    reused.load_lora("qv", qv)  # (the one slot, "all"'s before)
    assert run(reused) == want
    reused.close()


def test_a_layers_stacks_sharing_an_input_lie_in_one_buffer_as_adapters_join(tmp_path):
    """The stacks of the products that share an input lie in one buffer (the product
    before their call hints it), and stay there, values and all, when a later adapter
    adds a product to the group: the first adapter's tokens and logprobs do not change,
    bit for bit, nor the base's, and the second's equal a fresh engine's. (Prefix
    caching off: a cached prefix leaves fewer prompt rows to compute, and this float32
    model's products of another row count round otherwise.)"""
    folder = model_folder("qwen3", "config.json", tmp_path)
    qv = adapter_copy(tmp_path, "qwen3-r16", tensors=lambda t: {
        k: v for k, v in t.items() if ".q_proj." in k or ".v_proj." in k})
    every = os.path.join(FIXTURES, "qwen3-r4-rslora")
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=3, ignore_eos=True)
    prompt = [5, 6, 7, 8, 9]

    def run(llm, lora):
        out = llm.generate([prompt], params, lora=lora)[0].outputs[0]
        return out.token_ids, [e.logprob for e in out.token_logprobs]
    fresh = engine(folder, lora_modules={"every": every})
    want = run(fresh, "every")
    fresh.close()
    llm = engine(folder, max_loras=2, lora_modules={"qv": qv}, enable_prefix_caching=False)
    before = run(llm, "qv"), run(llm, None)
    slots = llm.engine.loras.slots
    assert {group for _, group in slots.regions} == {("q_proj", "k_proj", "v_proj")}
    llm.load_lora("every", every)
    assert (run(llm, "qv"), run(llm, None)) == before
    assert run(llm, "every") == want
    assert {group for _, group in slots.regions} == set(SHARED_INPUTS)
    for (layer, group), region in slots.regions.items():
        stacks = [slots.stacks[(layer, m)] for m in group if (layer, m) in slots.stacks]
        assert len(region) == slots.max_loras
        for slot in range(slots.max_loras):  # (a slot's parts together, in its row)
            assert sum(s.a[slot].nbytes + s.bt[slot].nbytes for s in stacks) <= region[slot].nbytes
            assert all(np.shares_memory(part[slot], region[slot]) for s in stacks for part in (s.a, s.bt))
    llm.close()

"""The CPU backend's prepared weights kept beside a GGUF file and mapped on the next
load (kernels/cpu/weight_cache.py): the same forms and values, the same text, mapped
rather than read; a changed file, a damaged cache or a folder that cannot be written
each fall back to preparing the weights from the file."""
import logging
import mmap
import os

import numpy as np

import gguf_writer as gw
from test_gguf_convert import write_tiny_llama_gguf
from test_lanes import random_packed
from tinypaged import LLM, SamplingParams
from tinypaged.kernels.cpu import prepare_weights, weight_cache
from tinypaged.kernels.cpu.lane_packed import LanePacked
from tinypaged.kernels.cpu.stack_rows import StackRows
from tinypaged.kernels.cpu.linear import LinearWeight
from tinypaged.formats.quant_kind import Q4_K, Q6_K, Q8_0

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
PROMPT = [1, 5, 9, 4, 7]


def tiny_gguf(path, seed_type=gw.GGML_Q8_0):
    """Q8_0 layer matrices (q/k/v and gate stacked), ffn_up Q4_1 (so gate and up are
    not: two kinds), 64 wide, so every matrix is laid out where the CPU can."""
    write_tiny_llama_gguf(path, ffn_up_type=gw.GGML_Q4_1, matrix_type=seed_type, hidden=64,
                          intermediate=128)
    return path


def greedy(path, **options) -> list[int]:
    with LLM(str(path), backend="cpu", **options) as llm:
        return llm.generate([PROMPT], GREEDY)[0].outputs[0].token_ids


def mapped(a: np.ndarray) -> bool:
    while a is not None and not isinstance(a, mmap.mmap):
        a = getattr(a, "base", None) if isinstance(a, np.ndarray) else getattr(a, "obj", None)
    return isinstance(a, mmap.mmap)


def test_the_second_load_maps_the_prepared_weights_and_gives_the_same_text(tmp_path):
    path = tiny_gguf(tmp_path / "tiny.gguf")
    fresh = greedy(path, layout_cache=False)
    assert not weight_cache.cache_path(path).exists()
    assert greedy(path) == fresh  # prepares, then keeps them
    assert weight_cache.cache_path(path).is_file()
    with LLM(str(path), backend="cpu") as llm:
        held = llm.engine.runner.model.w
        arrays = [a for w in held.values() for a in _arrays(w)]
        assert arrays and all(mapped(a) for a in arrays)
        assert llm.generate([PROMPT], GREEDY)[0].outputs[0].token_ids == fresh


def _arrays(w) -> list:
    if isinstance(w, np.ndarray):
        return [w]
    if isinstance(w, StackRows):
        return _arrays(w.stack[0])
    if isinstance(w, LinearWeight):
        return [w.data]
    names = ("quants", "scales", "mins", "supers", "fifths" if isinstance(w, LanePacked) else "highs")
    return [getattr(w, n) for n in names if getattr(w, n) is not None]


def test_a_file_changed_within_the_clock_tick_is_prepared_again(tmp_path):
    """Same size, same mtime (a rewrite within the file system's clock tick), other
    bytes: the key's digest of the file tells them apart."""
    path = tiny_gguf(tmp_path / "tiny.gguf")
    greedy(path)
    kept, stat = weight_cache.cache_path(path).read_bytes(), path.stat()
    data = bytearray(path.read_bytes())
    data[-2000:] = bytes(np.random.default_rng(1).integers(0, 40, 2000, dtype=np.uint8))
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    assert greedy(path) == greedy(path, layout_cache=False)
    assert weight_cache.cache_path(path).read_bytes() != kept  # replaced


def test_a_change_to_the_sources_that_make_the_forms_is_a_miss(tmp_path, monkeypatch):
    """The key holds a digest of the sources that split, stack and lay out the matrices
    (FORM_SOURCES): a file made by other sources is prepared again, not mapped."""
    path = tiny_gguf(tmp_path / "tiny.gguf")
    greedy(path)
    assert weight_cache.load_prepared_weights(path) is not None
    digest = weight_cache._form_sources_digest()
    monkeypatch.setattr(weight_cache, "_form_sources_digest", lambda: "other " + digest)
    assert weight_cache.load_prepared_weights(path) is None
    assert "kernels/cpu/stacks.py" in weight_cache.FORM_SOURCES


def test_a_damaged_cache_is_prepared_again_and_replaced(tmp_path):
    path = tiny_gguf(tmp_path / "tiny.gguf")
    fresh = greedy(path)
    cache = weight_cache.cache_path(path)
    whole = cache.read_bytes()
    cache.write_bytes(whole[:len(whole) // 2])  # truncated
    assert greedy(path) == fresh
    assert cache.read_bytes() == whole
    cache.write_bytes(b"\0" * 64)  # not one at all
    assert greedy(path) == fresh


def test_a_folder_that_cannot_be_written_only_costs_the_next_load(tmp_path, monkeypatch, caplog):
    path = tiny_gguf(tmp_path / "tiny.gguf")

    def refuse(*args, **kwargs):
        raise PermissionError("read-only folder")
    monkeypatch.setattr(weight_cache, "open", refuse, raising=False)
    with caplog.at_level(logging.WARNING, logger="tinypaged"):
        assert greedy(path) == greedy(path, layout_cache=False)
    assert "prepared weights not kept" in caplog.text
    assert not weight_cache.cache_path(path).exists()
    assert not list(tmp_path.glob("*.partial"))


def test_every_prepared_form_comes_back_with_its_values_and_its_sharing(tmp_path, monkeypatch):
    """LanePacked of three kinds, stacks and their views, a float matrix
    (LinearWeight), a norm (ndarray), a tied lm_head."""
    rng = np.random.default_rng(3)
    p = "model.layers.0."
    weights = {p + "self_attn.q_proj.weight": random_packed(rng, Q8_0, 64, 256),
               p + "self_attn.k_proj.weight": random_packed(rng, Q8_0, 32, 256),
               p + "self_attn.v_proj.weight": random_packed(rng, Q8_0, 32, 256),
               p + "mlp.gate_proj.weight": random_packed(rng, Q4_K, 48, 256),
               p + "mlp.up_proj.weight": random_packed(rng, Q6_K, 48, 256),
               p + "self_attn.o_proj.weight": rng.standard_normal((256, 64)).astype(np.float32),
               p + "input_layernorm.weight": rng.standard_normal(256).astype(np.float32),
               "model.embed_tokens.weight": random_packed(rng, Q6_K, 40, 256)}
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    prepared = prepare_weights(weights)
    source = tmp_path / "m.gguf"
    source.write_bytes(b"GGUF" + bytes(5000))
    weight_cache.save(source, prepared)
    back = weight_cache.load(source)
    assert back is not None and set(back) == set(prepared)
    for name, w in prepared.items():
        got = back[name]
        assert type(got) is type(w), name
        if isinstance(w, np.ndarray):
            assert np.array_equal(got, w)
            continue
        assert got.shape == w.shape
        rows = np.arange(w.shape[0])
        assert np.array_equal(got.dequantize(rows), w.dequantize(rows)), name
        assert got.kind is w.kind, name
        if getattr(w, "stack", None) is not None:
            assert getattr(got, "stack")[1:] == w.stack[1:]
    assert back["lm_head.weight"] is back["model.embed_tokens.weight"]
    stacks = {id(back[p + f"self_attn.{n}_proj.weight"].stack[0]) for n in "qkv"}
    assert len(stacks) == 1  # the views share one stack, as before
    other = "avx2" if weight_cache.LANES_ISA == "vnni" else "vnni"
    monkeypatch.setattr(weight_cache, "LANES_ISA", other)  # another CPU: not this file's layout
    assert weight_cache.load(source) is None


def test_a_models_kernel_list_is_written_at_exit_and_preloaded_at_its_next_load(tmp_path, monkeypatch):
    """kernel_list: what a run of one model called is kept for the model file (merged
    with what the list held), and the next load of that file loads each of them first;
    a process that loaded two models writes no list (what it called is not one's)."""
    import pickle
    from tinypaged.kernels import cpu
    from tinypaged.kernels.cpu import kernel_list
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    listed = str(tmp_path / "kernels.pkl")
    monkeypatch.setattr(kernel_list, "_list_path", lambda source: listed)
    monkeypatch.setattr(kernel_list, "_recorded", {listed})
    x = np.ones((2, 8), np.float32)
    cpu.rms_norm(x, np.ones(8, np.float32), 1e-5)
    kernel_list._save(listed, {"tinypaged.kernels.cpu.gone:_old": []})
    with open(listed, "rb") as f:
        saved = pickle.load(f)
    assert saved["tinypaged.kernels.cpu.elementwise:_rms_norm"] and "tinypaged.kernels.cpu.gone:_old" in saved
    assert kernel_list.load_kernels_for(model) == sum(len(sigs) for sigs in saved.values())
    kernel_list._recorded.add(str(tmp_path / "other.pkl"))
    os.remove(listed)
    kernel_list._save(listed, {})
    assert not os.path.exists(listed)

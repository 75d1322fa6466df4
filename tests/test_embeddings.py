"""Embeddings (LLM.embed) against sentence-transformers on tiny decoder models saved as
it saves them (fixtures by tools/make_embedding_fixtures.py: a bare Qwen3Model or
LlamaModel, one folder per pooling kind), batched and one at a time, with the prefix
cache, and every block back in the pool."""
import json
from pathlib import Path

import numpy as np
import pytest

from helpers import pooled_beside_generation
from tinypaged import LLM
from tinypaged.model.pooling import Pooling, pooling_of

FIXTURES = Path(__file__).parent / "fixtures" / "embeddings"
CASES = ["qwen3-lasttoken", "qwen3-mean", "llama-cls"]


def expected(case: str) -> dict:
    return json.loads((FIXTURES / case / "expected.json").read_text())


@pytest.mark.parametrize("case", CASES)
def test_embeddings_equal_sentence_transformers(case):
    """cos >= 0.9999 and |difference| < 1e-5 (measured: 1e-7 to 2e-6), each pooling
    read from the folder as sentence-transformers stores it."""
    want = expected(case)
    llm = LLM(FIXTURES / case, backend="cpu")
    assert llm.pooling == Pooling({"lasttoken": "last"}.get(want["pooling"], want["pooling"]),
                                  want["normalize"], "sentence-transformers")
    got = llm.embed(want["texts"])
    for g, w in zip(got, np.array(want["embeddings"], np.float32), strict=True):
        assert g.dtype == np.float32 and g.shape == w.shape
        assert g @ w / np.linalg.norm(g) / np.linalg.norm(w) >= 0.9999
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks  # (every block back: cached ones free too)
    llm.close()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("quantization", [None, "q8_0"])
def test_batched_equals_one_at_a_time_and_chunks_change_nothing(case, quantization):
    """Packed weights give a row the same bits in any batch (the lanes products); a
    float model's products take other paths by row count (within 2e-6 here)."""
    texts = expected(case)["texts"]
    llm = LLM(FIXTURES / case, backend="cpu", enable_prefix_caching=False, quantization=quantization)
    together = llm.embed(texts)
    alone = [llm.embed(text)[0] for text in texts]
    small = LLM(FIXTURES / case, backend="cpu", enable_prefix_caching=False,
                quantization=quantization, max_num_batched_tokens=7)  # (chunks of 7 tokens)
    chunked = small.embed(texts)
    for a, b, c in zip(together, alone, chunked):
        if quantization:
            np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)  # (float32 rounding: ~1e-6)
        np.testing.assert_allclose(a, c, atol=1e-5, rtol=0)
    llm.close()
    small.close()


def test_a_shared_instruction_prefix_comes_from_the_prefix_cache():
    """Last-token pooling reads one row a prompt: an instruction prefix computed once is
    read from the cache by the next prompts (counted), the values as without it."""
    case = FIXTURES / "qwen3-lasttoken"
    prefix = "Instruct: find the story about the cat and the big red ball.\nQuery: "
    queries = [prefix + q for q in ("a cat", "a dog in the park", "the sun")]
    cached = LLM(case, backend="cpu", block_size=4)
    plain = LLM(case, backend="cpu", block_size=4, enable_prefix_caching=False)
    bm = cached.engine.block_manager
    got = cached.embed(queries[:1]) + cached.embed(queries[1:])
    assert bm.prefix_hit_tokens >= 2 * 4 * (len(cached.tokenizer.encode(prefix)) // 4 - 1)
    for g, w in zip(got, plain.embed(queries)):
        np.testing.assert_allclose(g, w, atol=1e-6, rtol=0)
    cached.close()
    plain.close()


def test_an_embedding_model_does_not_generate_and_a_model_without_metadata_pools_its_last_token(
        stories_dir):
    llm = LLM(FIXTURES / "qwen3-mean", backend="cpu")
    with pytest.raises(ValueError, match="an embedding model .* does not generate"):
        llm.generate("hi")
    llm.close()
    stories = LLM(stories_dir)
    assert stories.pooling == Pooling("last", True, "default")
    vectors = stories.embed(["Once upon a time", [1, 5, 9]])
    assert all(abs(float(np.linalg.norm(v)) - 1) < 1e-6 for v in vectors)
    stories.close()


def test_poolings_tinypaged_does_not_compute_are_refused_by_name(tmp_path):
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True}))
    with pytest.raises(ValueError, match="'sentence_transformers.models.Dense' is not one"):
        pooling_of(tmp_path)
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    assert pooling_of(tmp_path) == Pooling("mean", False, "sentence-transformers")  # (older flags)
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "pooling_mode_max_tokens": True}))
    with pytest.raises(ValueError, match="pooling_mode_max_tokens is not one tinypaged computes"):
        pooling_of(tmp_path)
    assert pooling_of("x.gguf", {"general.architecture": "qwen3", "qwen3.pooling_type": 1}) \
        == Pooling("mean", True, "gguf")
    with pytest.raises(ValueError, match="pooling_type=4 is not a pooling"):
        pooling_of("x.gguf", {"general.architecture": "qwen3", "qwen3.pooling_type": 4})


def test_a_gguf_embedding_file_pools_as_its_pooling_type_says(tmp_path):
    """The Qwen3 fixture as llama.cpp's converter writes an embedding model (no output
    matrix, qwen3.pooling_type 3: last): the vectors sentence-transformers computes."""
    import gguf_writer as gw
    from test_hf_parity import write_gguf
    case = "qwen3-lasttoken"
    want = expected(case)
    folder = LLM(FIXTURES / case, backend="cpu")
    ids = [folder.engine.prompt_ids(text) for text in want["texts"]]  # (BOS and all)
    folder.close()
    path = tmp_path / "qwen3-embedding.gguf"
    write_gguf(case, path, source=str(FIXTURES / case), extra=(("qwen3.pooling_type", gw.U32, 3),))
    llm = LLM(path, backend="cpu", kv_cache_dtype="float32")
    assert llm.pooling == Pooling("last", True, "gguf")
    for g, w in zip(llm.embed(ids), np.array(want["embeddings"], np.float32), strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)
    llm.close()


def test_a_matryoshka_model_gives_shorter_embeddings_and_others_refuse_them(tmp_path):
    """config.json's is_matryoshka or matryoshka_dimensions (vLLM's keys): the first d
    values, normalized again; a model that declares neither refuses, by name."""
    import shutil
    case = "qwen3-lasttoken"
    want = np.array(expected(case)["embeddings"], np.float32)
    texts = expected(case)["texts"]
    plain = LLM(FIXTURES / case, backend="cpu")
    with pytest.raises(ValueError, match="dimensions=16: this model's embeddings have 64, and "
                                         "it declares no shorter ones"):
        plain.embed(texts, dimensions=16)
    np.testing.assert_allclose(plain.embed(texts, dimensions=64), want, atol=1e-5)
    plain.close()
    for key, value, refused in (("is_matryoshka", True, None), ("matryoshka_dimensions", [16, 32], 24)):
        folder = tmp_path / key
        shutil.copytree(FIXTURES / case, folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, key: value}))
        llm = LLM(folder, backend="cpu")
        for got, w in zip(llm.embed(texts, dimensions=16), want):
            np.testing.assert_allclose(got, w[:16] / np.linalg.norm(w[:16]), atol=1e-5)
        if refused is not None:
            with pytest.raises(ValueError, match="dimensions=24: this model's embeddings have only 16, 32 or 64"):
                llm.embed(texts, dimensions=refused)
        with pytest.raises(ValueError, match=r"dimensions=65 must be an integer in \[1, 64\]"):
            llm.embed(texts, dimensions=65)
        llm.close()


def _engine(case: str, **options):
    from tinypaged.config import EngineConfig
    from tinypaged.engine.llm_engine import LLMEngine
    return LLMEngine(str(FIXTURES / case), EngineConfig(backend="cpu", **options))


def _embedding_request(engine, ids: list[int], pooling: Pooling):
    from tinypaged.engine.request import PreparedRequest
    from tinypaged.llm import EMBEDDING_PARAMS
    return PreparedRequest(None, ids, EMBEDDING_PARAMS, pooling=pooling)


def test_embeddings_join_the_running_batch_beside_generation(tmp_path):
    """On a model that generates and embeds, an embedding request added while a request
    decodes runs in the same steps (its prompt prefilled, never decoded) and ends with
    its vector, which is what it is alone; the generation goes on, its tokens the same."""
    from test_hf_parity import model_folder
    from tinypaged import SamplingParams
    from tinypaged.config import EngineConfig
    from tinypaged.engine.llm_engine import LLMEngine
    folder = model_folder("qwen3", "config.json", tmp_path)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    mean = Pooling("mean", True)
    doc = list(range(3, 40))

    def fresh():
        return LLMEngine(folder, EngineConfig(backend="cpu", block_size=4, max_num_batched_tokens=16))
    alone = fresh()
    alone.add_prepared(_embedding_request(alone, doc, mean), "e")
    want = [o for o in alone.step() + alone.step() + alone.step() if o.finished][0].embedding
    vectors, steps_together = pooled_beside_generation(
        fresh, params, lambda engine: [engine.add_prepared(_embedding_request(engine, doc, mean), "e")])
    assert steps_together == 3  # (37 tokens in chunks of at most 16, beside a decode row)
    np.testing.assert_allclose(vectors["e"], want, atol=1e-6, rtol=0)


def test_embeddings_preempted_under_pressure_are_computed_again_whole(tmp_path, monkeypatch):
    """A pool too small for everything, generations growing beside embedding prompts
    that pool every row: the prompts preempted part-way are prefilled again from their
    start (their sums start anew), and every vector is what it is alone."""
    from test_hf_parity import model_folder
    from tinypaged import SamplingParams
    from tinypaged.config import EngineConfig
    from tinypaged.engine.llm_engine import LLMEngine
    from tinypaged.engine.pooled import PooledState
    starts = []
    take = PooledState.take

    def counted(self, rows, first_chunk, last_chunk, length):
        starts.append(first_chunk)
        return take(self, rows, first_chunk, last_chunk, length)
    folder = model_folder("qwen3", "config.json", tmp_path)
    docs = [list(range(3 + i, 30 + i)) for i in range(4)]
    mean = Pooling("mean", True)
    alone = LLMEngine(folder, EngineConfig(backend="cpu", block_size=4))
    want = []
    for doc in docs:
        alone.add_prepared(_embedding_request(alone, doc, mean), "e")
        while alone.has_unfinished():
            outs = alone.step()
        want.append(outs[0].embedding)
    monkeypatch.setattr(PooledState, "take", counted)
    engine = LLMEngine(folder, EngineConfig(backend="cpu", block_size=4, num_blocks=20,
                                            max_num_batched_tokens=8))
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    for i in range(3):
        engine.add_request([5 + i, 6, 7], params, f"g{i}")
    engine.step()
    for i, doc in enumerate(docs):
        engine.add_prepared(_embedding_request(engine, doc, mean), str(i))
    got = {}
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None, out.error
            if out.finished and out.embedding is not None:
                got[int(out.request_id)] = out.embedding
    assert engine.scheduler.num_preemptions > 0 and sum(starts) > len(docs)  # (prefilled again)
    for i, w in enumerate(want):
        np.testing.assert_allclose(got[i], w, atol=1e-5, rtol=0)


@pytest.mark.cuda
def test_the_cuda_backend_embeds_as_the_cpu_does():
    case = "qwen3-mean"
    want = expected(case)
    llm = LLM(FIXTURES / case, backend="cuda", num_blocks=32, gpu_weight_dtype="float32",
              kv_cache_dtype="float32")
    for g, w in zip(llm.embed(want["texts"][:2]), np.array(want["embeddings"][:2], np.float32)):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)
    llm.close()

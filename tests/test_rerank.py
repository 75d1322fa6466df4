"""Reranking (LLM.score, POST /v1/rerank) against transformers on a tiny Qwen3 scoring
as Qwen3-Reranker does (fixture by tools/make_rerank_fixture.py): the same prompt ids,
the same scores, the same order."""
import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from helpers import pooled_beside_generation
from serving import ServerThread
from tinypaged import LLM
from tinypaged.rerank import rerank_prompt

FIXTURE = Path(__file__).parent / "fixtures" / "rerank" / "qwen3"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())


@pytest.fixture(scope="module")
def reranker():
    llm = LLM(FIXTURE, backend="cpu")
    server = ServerThread(llm)
    yield server
    server.stop()
    llm.close()


def test_scores_equal_transformers_and_keep_its_order(reranker):
    llm = reranker.llm
    for document, ids in zip(EXPECTED["documents"], EXPECTED["prompt_ids"]):
        assert llm.engine.prompt_ids(rerank_prompt(EXPECTED["query"], document,
                                                   EXPECTED["instruction"])) == ids
    got = llm.score(EXPECTED["query"], EXPECTED["documents"], EXPECTED["instruction"])
    np.testing.assert_allclose(got, EXPECTED["scores"], atol=1e-5, rtol=0)  # (measured: 3e-7)
    assert list(np.argsort(got)) == list(np.argsort(EXPECTED["scores"]))
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_the_rerank_route_ranks_and_cuts(reranker):
    body = {"query": EXPECTED["query"], "documents": EXPECTED["documents"],
            "instruction": EXPECTED["instruction"]}
    out = httpx.post(reranker.url + "/v1/rerank", json=body, timeout=60).json()
    order = sorted(range(4), key=lambda i: -EXPECTED["scores"][i])
    assert [r["index"] for r in out["results"]] == order
    for r in out["results"]:
        assert abs(r["relevance_score"] - EXPECTED["scores"][r["index"]]) < 1e-5
        assert r["document"] == {"text": EXPECTED["documents"][r["index"]]}
    assert out["usage"]["total_tokens"] > 0 and out["model"] == "qwen3"
    short = httpx.post(reranker.url + "/rerank", timeout=60, json={
        **body, "documents": [{"text": d} for d in EXPECTED["documents"]], "top_n": 2,
        "return_documents": False}).json()
    assert [r["index"] for r in short["results"]] == order[:2]
    assert all("document" not in r for r in short["results"])


def test_scoring_joins_the_running_batch_beside_generation():
    """A reranker's prompts are requests of the continuous batch (as LLM.score sends
    them): added while a request decodes, they are prefilled in the same steps, the
    generation going on with the same tokens, and their last states through the head
    give transformers' scores; every block goes back."""
    from tinypaged import SamplingParams
    from tinypaged.config import EngineConfig
    from tinypaged.engine.llm_engine import LLMEngine
    from tinypaged.engine.pooled import SCORE_POOLING, head_logits
    from tinypaged.engine.request import PreparedRequest
    from tinypaged.llm import EMBEDDING_PARAMS
    from tinypaged.rerank import answer_ids
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    engines = []

    def fresh():
        engines.append(LLMEngine(str(FIXTURE), EngineConfig(backend="cpu", max_num_batched_tokens=128)))
        return engines[-1]

    def add_prompts(engine):
        return [engine.add_prepared(PreparedRequest(None, ids, EMBEDDING_PARAMS, pooling=SCORE_POOLING),
                                    f"score-{i}") for i, ids in enumerate(EXPECTED["prompt_ids"])]
    states, steps_together = pooled_beside_generation(fresh, params, add_prompts)
    assert 1 < steps_together < 64 and len(states) == len(EXPECTED["prompt_ids"])
    engine = engines[-1]
    names = [f"score-{i}" for i in range(len(EXPECTED["prompt_ids"]))]
    yes, no = answer_ids(engine.tokenizer)
    answers = head_logits(engine.runner.model, np.stack([states[n] for n in names]), (yes, no))
    np.testing.assert_allclose(1 / (1 + np.exp(answers[:, 1] - answers[:, 0])), EXPECTED["scores"],
                               atol=1e-5, rtol=0)


@pytest.mark.cuda
def test_the_cuda_backend_scores_as_transformers_does():
    llm = LLM(FIXTURE, backend="cuda", num_blocks=32, gpu_weight_dtype="float32", kv_cache_dtype="float32")
    got = llm.score(EXPECTED["query"], EXPECTED["documents"][:1], EXPECTED["instruction"])
    np.testing.assert_allclose(got, EXPECTED["scores"][:1], atol=1e-5, rtol=0)
    llm.close()

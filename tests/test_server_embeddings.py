"""POST /v1/embeddings through the official OpenAI client: the vectors LLM.embed gives
(floats, and the base64 the client asks for by default), texts and token ids, batches,
usage; an embedding model's server embeds after its warm-up and refuses to chat."""
import base64
import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from serving import ServerThread, client_for
from tinypaged import LLM

FIXTURE = Path(__file__).parent / "fixtures" / "embeddings" / "qwen3-lasttoken"


@pytest.fixture(scope="module")
def embedder():
    llm = LLM(FIXTURE, backend="cpu")
    server = ServerThread(llm, warm_up=True)
    yield server
    server.stop()
    llm.close()


def test_the_openai_client_gets_the_library_vectors(embedder):
    texts = json.loads((FIXTURE / "expected.json").read_text())["texts"]
    want = embedder.llm.embed(texts)
    client = client_for(embedder)
    got = {}
    # the client asks for base64 unless told and decodes it; asked for base64, it hands
    # the text over as it came (little-endian float32 bytes)
    for encoding in ("float", "base64", None):
        options = {"encoding_format": encoding} if encoding else {}
        out = client.embeddings.create(model="any", input=texts, **options)
        assert [d.index for d in out.data] == list(range(len(texts)))
        got[encoding] = np.array([np.frombuffer(base64.b64decode(d.embedding), "<f4")
                                  if encoding == "base64" else d.embedding for d in out.data], np.float32)
    # (prompts met again read their prefixes from the cache: the same to float32 rounding)
    np.testing.assert_allclose(got["float"], np.array(want), atol=1e-6, rtol=0)
    np.testing.assert_array_equal(got["base64"], got["float"])
    np.testing.assert_array_equal(got[None], got["float"])
    ids = embedder.llm.tokenizer.encode(texts[0])
    one = client.embeddings.create(model="any", input=ids)
    np.testing.assert_allclose(np.array(one.data[0].embedding, np.float32), want[0], atol=1e-6, rtol=0)
    assert one.usage.prompt_tokens == one.usage.total_tokens == len(ids)
    batch = client.embeddings.create(model="any", input=[ids, ids[:3]])
    assert len(batch.data) == 2 and batch.usage.prompt_tokens == len(ids) + 3
    raw = httpx.post(embedder.url + "/v1/embeddings", json={"input": texts[0]}, timeout=60).json()
    assert raw["object"] == "list" and raw["data"][0]["object"] == "embedding"
    assert raw["model"] == FIXTURE.name


def test_an_embedding_models_server_is_ready_and_refuses_to_generate(embedder):
    assert httpx.get(embedder.url + "/health", timeout=60).json() == {"status": "ok"}
    r = httpx.post(embedder.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                   timeout=60)
    assert r.status_code == 400 and "embedding model" in r.json()["error"]["message"]


def test_langchain_openai_embeddings_against_the_server(embedder):
    """langchain's OpenAIEmbeddings as vLLM's docs set it up for a model that is not
    OpenAI's: texts sent as they are (check_embedding_ctx_length=False; its default
    would send tiktoken's token ids of another vocabulary)."""
    import langchain_openai  # (the test extra's)
    texts = json.loads((FIXTURE / "expected.json").read_text())["texts"]
    embeddings = langchain_openai.OpenAIEmbeddings(
        model=FIXTURE.name, base_url=embedder.url + "/v1", api_key="none",
        check_embedding_ctx_length=False)
    docs = np.array(embeddings.embed_documents(texts), np.float32)
    query = np.array(embeddings.embed_query(texts[1]), np.float32)
    want = np.array(embedder.llm.embed(texts))
    np.testing.assert_allclose(docs, want, atol=1e-6, rtol=0)
    np.testing.assert_allclose(query, want[1], atol=1e-6, rtol=0)


def test_dimensions_the_model_does_not_declare_are_a_400(embedder):
    client = client_for(embedder)
    import openai
    with pytest.raises(openai.BadRequestError, match="declares no shorter ones") as caught:
        client.embeddings.create(model="any", input="hello", dimensions=16)
    assert caught.value.body["param"] == "dimensions"
    width = embedder.llm.config.hidden_size
    out = client.embeddings.create(model="any", input="hello", dimensions=width, encoding_format="float")
    assert len(out.data[0].embedding) == width

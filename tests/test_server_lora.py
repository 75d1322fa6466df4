"""LoRA adapters over HTTP, as vLLM serves them: a request runs an adapter by naming it
as its model (the openai client), /v1/models lists the adapters beside the base,
/v1/load_lora_adapter and /v1/unload_lora_adapter change them while the server runs,
a bad adapter is refused by name and the server goes on, and a request that runs
while its adapter is unloaded finishes."""
import os

import httpx
import pytest

from serving import ServerThread, client_for
from test_hf_parity import model_folder
from tinypaged import LLM, SamplingParams

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "lora")
PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = model_folder("qwen3", "config.json", tmp_path_factory.mktemp("qwen3"))
    llm = LLM(folder, backend="cpu", block_size=4, max_loras=2,
              lora_modules={"tuned": os.path.join(FIXTURES, "qwen3-r16")})
    server = ServerThread(llm, served_model_name="qwen3-tiny", warm_up=True)  # (its adapter too)
    yield server
    server.stop()
    llm.close()


def library_text(llm, lora, max_tokens=8) -> str:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return llm.generate([PROMPT], params, lora=lora)[0].outputs[0].text


def test_a_request_runs_the_adapter_its_model_names(served):
    client = client_for(served)
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {"qwen3-tiny", "tuned"}
    assert models["tuned"].model_extra["parent"] == "qwen3-tiny"
    assert models["tuned"].model_extra["root"] == os.path.join(FIXTURES, "qwen3-r16")
    assert client.models.retrieve("tuned").id == "tuned"
    texts = {}
    for model in ("tuned", "qwen3-tiny"):
        out = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                        extra_body={"ignore_eos": True})
        assert out.model == model
        texts[model] = out.choices[0].text
    assert texts["tuned"] == library_text(served.llm, "tuned")
    assert texts["qwen3-tiny"] == library_text(served.llm, None)
    assert texts["tuned"] != texts["qwen3-tiny"]


def test_adapters_load_and_unload_while_the_server_runs(served):
    url, client = served.url, client_for(served)
    path = os.path.join(FIXTURES, "qwen3-r4-rslora")
    ok = httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "other", "lora_path": path})
    assert ok.status_code == 200 and "added successfully" in ok.text
    out = client.completions.create(model="other", prompt=PROMPT, max_tokens=8, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.model == "other" and out.choices[0].text == library_text(served.llm, "other")
    again = httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "other", "lora_path": path})
    assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]
    gone = httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": "other"})
    assert gone.status_code == 200 and "removed successfully" in gone.text
    assert {m.id for m in client.models.list().data} == {"qwen3-tiny", "tuned"}
    missing = httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": "other"})
    assert missing.status_code == 404 and "'other'" in missing.json()["error"]["message"]


@pytest.mark.parametrize("path, words", [
    (os.path.join(FIXTURES, "llama-r4"), "made for LlamaForCausalLM"),
    ("/nonexistent/adapter", "no adapter_config.json"),
])
def test_a_bad_adapter_is_refused_by_name_and_the_server_goes_on(served, path, words):
    bad = httpx.post(served.url + "/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": path})
    assert bad.status_code == 400
    assert words in bad.json()["error"]["message"] and bad.json()["error"]["param"] == "lora_path"
    out = client_for(served).completions.create(model="tuned", prompt=PROMPT, max_tokens=8,
                                                temperature=0, extra_body={"ignore_eos": True})
    assert out.choices[0].text == library_text(served.llm, "tuned")


def test_a_stream_finishes_on_its_adapter_while_it_is_unloaded(served):
    url = served.url
    path = os.path.join(FIXTURES, "qwen3-r4-rslora")
    assert httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "brief", "lora_path": path}).status_code == 200
    want = library_text(served.llm, "brief", max_tokens=40)
    stream = client_for(served).completions.create(model="brief", prompt=PROMPT, max_tokens=40,
                                                   temperature=0, stream=True,
                                                   extra_body={"ignore_eos": True})
    chunks = iter(stream)
    text = next(chunks).choices[0].text  # (running: its first token is out)
    assert httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": "brief"}).status_code == 200
    text += "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == want

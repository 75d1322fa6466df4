"""The structured outputs rows: decode throughput with half the requests under a JSON
schema against the same run free, and the time to the first token of a request
whose schema is new against one whose schema is cached."""
from __future__ import annotations

import time

import numpy as np

from .. import LLM, SamplingParams
from ..structured import StructuredOutputs
from .rates import KV_BUDGET, MAX_MODEL_LEN, engine_decode_rate, on_engine_thread

# long enough that no sample ends inside the 48 tokens measured (the batch stays full)
STORY = {"type": "object", "additionalProperties": False, "required": ["title", "story"],
         "properties": {"title": {"type": "string", "maxLength": 40},
                        "story": {"type": "string", "minLength": 600}}}


def _first_token_seconds(engine, structured: StructuredOutputs) -> float:
    """From add_request (where the schema compiles) to the first token's step."""
    start = time.perf_counter()
    request_id = engine.add_request("Describe a person as JSON.",
                                    SamplingParams(max_tokens=1, temperature=0,
                                                   structured_outputs=structured))
    while request_id in engine.requests:
        engine.step()
    return time.perf_counter() - start


def _person(i: int) -> StructuredOutputs:
    """A schema no one has asked for before (its property name differs)."""
    return StructuredOutputs(json={"type": "object", "required": [f"name_{i}", "age"],
                                   "properties": {f"name_{i}": {"type": "string"},
                                                  "age": {"type": "integer"}}})


def structured(model_dir, log, concurrency: int = 32, rounds: int = 3) -> dict:
    llm = LLM(model_dir, kv_cache_memory=KV_BUDGET, max_model_len=MAX_MODEL_LEN)
    free = SamplingParams(temperature=0.8, top_p=0.9, seed=0, max_tokens=48, ignore_eos=True)
    held = SamplingParams(temperature=0.8, top_p=0.9, seed=0, max_tokens=48, ignore_eos=True,
                          structured_outputs=StructuredOutputs(json=STORY))
    kinds = {"free": [free] * concurrency,
             "half_json": [held if i % 2 else free for i in range(concurrency)]}
    # the engine's first constrained request also builds llguidance's tokenizer
    first_ever = on_engine_thread(llm, lambda e: _first_token_seconds(e, _person(-1)))
    on_engine_thread(llm, lambda e: engine_decode_rate(e, 4, kinds["half_json"][:4]))  # warm up
    runs = {name: [] for name in kinds}
    for _ in range(rounds):  # alternated: the machine's speed drifts between runs
        for name, params in kinds.items():
            runs[name].append(on_engine_thread(llm, lambda e: engine_decode_rate(e, concurrency, params)))
    rates = {name: float(np.median(r)) for name, r in runs.items()}
    ttft = {"new": [], "cached": []}
    for i in range(5):
        schema = _person(i)
        ttft["new"].append(on_engine_thread(llm, lambda e: _first_token_seconds(e, schema)))
        ttft["cached"].append(on_engine_thread(llm, lambda e: _first_token_seconds(e, schema)))
    ttft_median = {k: float(np.median(v)) for k, v in ttft.items()}
    out = {"concurrency": concurrency, "tokens_per_s": rates, "runs": runs,
           "half_json_vs_free": rates["half_json"] / rates["free"],
           "ttft_s": {**ttft_median, "first_of_the_engine": first_ever}, "ttft_runs": ttft}
    log(f"decode at {concurrency} concurrent, free vs half under a JSON schema: "
        f"{rates['free']:.0f} vs {rates['half_json']:.0f} tokens/s "
        f"(x{out['half_json_vs_free']:.2f}); first token with a new schema "
        f"{ttft_median['new'] * 1e3:.0f} ms, cached {ttft_median['cached'] * 1e3:.0f} ms, the "
        f"engine's first (tokenizer built) {first_ever * 1e3:.0f} ms")
    return out


def report_rows(r: dict) -> list[tuple[str, str, str]]:
    s = r.get("structured")
    if not s:
        return []
    rates, ttft = s["tokens_per_s"], s["ttft_s"]
    return [("structured", f"decode, {s['concurrency']} concurrent: free vs half under a "
             f"JSON schema", f"{rates['free']:.0f} vs {rates['half_json']:.0f} tokens/s "
             f"(x{s['half_json_vs_free']:.2f})"),
            ("structured", "time to first token: a schema seen for the first time vs cached",
             f"{ttft['new'] * 1e3:.0f} ms vs {ttft['cached'] * 1e3:.0f} ms"),
            ("structured", "time to first token of the engine's first constrained request "
             "(builds llguidance's tokenizer)", f"{ttft['first_of_the_engine'] * 1e3:.0f} ms")]

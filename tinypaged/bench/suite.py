"""The benchmark rows: memory, sharing, prefix caching, throughput. Each returns a
dict of figures; `run_all` prints a table and writes them all as JSON."""
from __future__ import annotations

import gc
import json
import time

import numpy as np

from .. import LLM, SamplingParams
from ..engine.block_manager import blocks_for
from ..model.paged_model import PagedKVCache
from . import hf_peer, llama_cpp_peer, peak_rss, structured_rows
from .format_rates import measure_in_own_process
from .rates import KV_BUDGET, MAX_MODEL_LEN, decode_rate, on_engine_thread
from .workload import Request, chat_requests, long_tailed_workload, prose_prompt

def run_requests(llm, requests) -> dict:
    """Run (prompt ids, output length) requests to completion, greedy, no early EOS."""
    return on_engine_thread(llm, lambda engine: _run_requests(engine, requests))


def _run_requests(engine, requests) -> dict:
    start = time.perf_counter()
    ids = [engine.add_request(r.prompt_ids, SamplingParams(temperature=0, max_tokens=r.output_len,
                                                           ignore_eos=True)) for r in requests]
    first, peak_running = {}, 0
    while engine.has_unfinished():
        for out in engine.step():
            first.setdefault(out.request_id, time.perf_counter() - start)
        peak_running = max(peak_running, len(engine.scheduler.running))
    seconds = time.perf_counter() - start
    tokens = sum(r.output_len for r in requests)
    return {"seconds": seconds, "output_tokens": tokens, "tokens_per_s": tokens / seconds,
            "ttft_mean_s": float(np.mean([first[i] for i in ids])), "peak_running": peak_running}


def memory(model_dir, requests, log) -> dict:
    llm = LLM(model_dir, kv_cache_memory=KV_BUDGET, max_model_len=MAX_MODEL_LEN)
    cfg, bs = llm.config, llm.engine.block_manager.block_size
    per_token = PagedKVCache.bytes_per_block(cfg, 1)
    run = run_requests(llm, requests)
    stats = llm.stats()
    lengths = np.array([len(r.prompt_ids) + r.output_len for r in requests])
    paged_slots = sum(blocks_for(n, bs) * bs for n in lengths)
    contiguous_fit = KV_BUDGET // (MAX_MODEL_LEN * per_token)
    out = {
        "requests": len(requests), "block_size": bs, "max_model_len": MAX_MODEL_LEN,
        "kv_budget_bytes": KV_BUDGET, "bytes_per_token": per_token,
        "tinypaged_bytes_all_requests": int(paged_slots * per_token),
        "contiguous_bytes_all_requests": int(len(requests) * MAX_MODEL_LEN * per_token),
        "tinypaged_waste_pct_final": 100 * (1 - lengths.sum() / paged_slots),
        "tinypaged_waste_pct_final_by_block_size": {
            b: 100 * (1 - lengths.sum() / sum(blocks_for(n, b) * b for n in lengths))
            for b in (8, 16, 32)},
        "contiguous_waste_pct_final": 100 * (1 - lengths.mean() / MAX_MODEL_LEN),
        "tinypaged_waste_pct_run_avg": 100 * (1 - stats["kv_utilization"]),
        "fit_at_once_tinypaged": run["peak_running"], "fit_at_once_contiguous": int(contiguous_fit),
        "tinypaged_peak_bytes": int(stats["peak_blocks"] * bs * per_token),
        "workload_run": run,
    }
    log(f"memory: {len(requests)} requests, mean length {lengths.mean():.0f} tokens")
    return out


def sharing(model_dir, prompt_ids, log) -> dict:
    sample = SamplingParams(n=8, temperature=0.8, seed=0, max_tokens=64, ignore_eos=True)
    shared = LLM(model_dir, kv_cache_memory=KV_BUDGET)
    shared.generate([prompt_ids], sample)
    independent = LLM(model_dir, kv_cache_memory=KV_BUDGET, enable_prefix_caching=False)
    one = SamplingParams(temperature=0.8, seed=0, max_tokens=64, ignore_eos=True)
    independent.generate([prompt_ids] * 8, one)
    beams = LLM(model_dir, kv_cache_memory=KV_BUDGET).beam_search(
        [prompt_ids], beam_width=4, max_tokens=64, ignore_eos=True)[0]
    n8, n8_indep = shared.stats()["peak_blocks"], independent.stats()["peak_blocks"]
    log("sharing: n=8 samples and beam width 4")
    return {"prompt_tokens": len(prompt_ids), "new_tokens": 64,
            "parallel_n8_blocks": n8, "parallel_n8_independent_blocks": n8_indep,
            "parallel_saving_pct": 100 * (1 - n8 / n8_indep),
            "beam4_blocks": beams.peak_blocks, "beam4_independent_blocks": beams.peak_blocks_unshared,
            "beam_saving_pct": 100 * (1 - beams.peak_blocks / beams.peak_blocks_unshared)}


def prefix_caching(model_dir, log) -> dict:
    out = {}
    for caching in (False, True):
        llm = LLM(model_dir, kv_cache_memory=KV_BUDGET, enable_prefix_caching=caching)
        chats = chat_requests(llm)
        requests = [Request(llm.tokenizer.encode(c), 8) for c in chats]
        run = run_requests(llm, requests)
        key = "on" if caching else "off"
        out[key] = {"prefill_tokens_computed": llm.stats()["prefill_tokens_computed"],
                    "prompt_tokens": sum(len(r.prompt_ids) for r in requests),
                    "ttft_mean_s": run["ttft_mean_s"], "total_s": run["seconds"]}
        log(f"prefix caching {key}: {out[key]['prefill_tokens_computed']} prefill tokens")
    out["computed_ratio"] = out["on"]["prefill_tokens_computed"] / out["off"]["prefill_tokens_computed"]
    return out


def sampling(model_dir, log, concurrency: int = 32, rounds: int = 3) -> dict:
    """Decode at `concurrency` requests: greedy against temperature 0.8 + top-p 0.9,
    alternated over a few rounds (medians), since runs a minute apart differ by ~10%."""
    llm = LLM(model_dir, kv_cache_memory=KV_BUDGET, max_model_len=MAX_MODEL_LEN)
    llm.generate(["warm up"] * 4, SamplingParams(temperature=0.8, top_p=0.9, max_tokens=4))
    kinds = {"greedy": SamplingParams(temperature=0, max_tokens=48, ignore_eos=True),
             "top_p": SamplingParams(temperature=0.8, top_p=0.9, seed=0, max_tokens=48,
                                     ignore_eos=True)}
    runs = {name: [] for name in kinds}
    for _ in range(rounds):
        for name, params in kinds.items():
            runs[name].append(decode_rate(llm, concurrency, params))
    rates = {name: float(np.median(r)) for name, r in runs.items()}
    log(f"decode at {concurrency} concurrent: greedy {rates['greedy']:.0f}, top-p "
        f"{rates['top_p']:.0f} tokens/s")
    return {"concurrency": concurrency, "tokens_per_s": rates, "runs": runs,
            "top_p_vs_greedy": rates["top_p"] / rates["greedy"]}


def weight_formats(model_dir, log, gguf_path=None) -> dict:
    """Decode tokens/s at 1 and 32 concurrent requests, the weights' bytes and the peak
    RSS of a `generate` run, for the float16 folder, the same with
    quantization="q8_0", and the model's GGUF (packed); each format measured in a
    process of its own (format_rates.py says why)."""
    kinds = {"float16": (model_dir, None), "q8_0": (model_dir, "q8_0")}
    if gguf_path is not None:
        kinds["gguf"] = (gguf_path, None)
    out = {}
    for name, (path, quantization) in kinds.items():
        out[name] = measure_in_own_process(path, quantization)
        if peak_rss.available():
            extra = ["--quantization", quantization] if quantization else []
            out[name]["generate_peak_rss"] = peak_rss.generate_peak_rss(path, extra)
        log(f"{name}: batch 1 {out[name]['batch1_tokens_per_s']:.0f}, 32 concurrent "
            f"{out[name]['concurrent32_tokens_per_s']:.0f} tokens/s, weights "
            f"{out[name]['weight_bytes'] / 2 ** 20:.0f} MiB, generate peak RSS "
            f"{out[name].get('generate_peak_rss', 0) / 2 ** 20:.0f} MiB")
    return out


def throughput(model_dir, requests, log) -> dict:
    llm = LLM(model_dir, kv_cache_memory=KV_BUDGET, max_model_len=MAX_MODEL_LEN)
    rates = {}
    for concurrency in (1, 8, 32, 64):
        rates[concurrency] = decode_rate(llm, concurrency, SamplingParams(
            temperature=0, max_tokens=32, ignore_eos=True))
        log(f"decode at {concurrency} concurrent: {rates[concurrency]:.0f} tokens/s")
    per_token = PagedKVCache.bytes_per_block(llm.config, 1)
    contiguous_fit = int(KV_BUDGET // (MAX_MODEL_LEN * per_token))
    paged = run_requests(LLM(model_dir, kv_cache_memory=KV_BUDGET, max_model_len=MAX_MODEL_LEN),
                         requests)
    contiguous = run_requests(LLM(model_dir, kv_cache_memory=KV_BUDGET, max_model_len=MAX_MODEL_LEN,
                                  max_num_seqs=contiguous_fit), requests)
    log(f"workload: paged {paged['seconds']:.1f} s, contiguous-capped {contiguous['seconds']:.1f} s")
    out = {"decode_tokens_per_s": rates, "workload_paged": paged,
           "workload_contiguous": contiguous, "contiguous_max_concurrent": contiguous_fit}
    if hf_peer.available():
        out["hf_transformers"] = hf_peer.run(model_dir, requests, log)
    else:
        log("hf transformers: not installed (pip install -e '.[bench]'), rows skipped")
    return out


def _default_gguf(model_dir):
    """The default model's GGUF when the folder is the default model's."""
    from ..pull import DEFAULT_GGUF, DEFAULT_MODEL_DIR
    same = str(model_dir) == str(DEFAULT_MODEL_DIR) and DEFAULT_GGUF.is_file()
    return DEFAULT_GGUF if same else None


def run_all(model_dir, out_path: str, log=print, llama_bench: str | None = None) -> dict:
    """Every row; llama_bench: a built llama.cpp `llama-bench`, run on the default
    model's GGUF beside our own rows."""
    llm = LLM(model_dir, kv_cache_memory=64 << 20)
    requests = long_tailed_workload(llm.tokenizer)
    prompt_ids = prose_prompt(llm.tokenizer, 200)
    rows = {"memory": lambda: memory(model_dir, requests, log),
            "sharing": lambda: sharing(model_dir, prompt_ids, log),
            "prefix_caching": lambda: prefix_caching(model_dir, log),
            "throughput": lambda: throughput(model_dir, requests, log),
            "sampling": lambda: sampling(model_dir, log),
            "structured": lambda: structured_rows.structured(model_dir, log),
            "weight_formats": lambda: weight_formats(model_dir, log, _default_gguf(model_dir))}
    results = {"model": str(model_dir)}
    for name, row in rows.items():
        results[name] = row()
        gc.collect()  # the row's LLMs, their loop threads and OpenMP teams end here
    gguf = _default_gguf(model_dir)
    if llama_bench and gguf is not None:
        results["llama_cpp"] = llama_cpp_peer.run(llama_bench, gguf, log)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=2, default=float)
    return results

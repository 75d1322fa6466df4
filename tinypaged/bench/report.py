"""The benchmark results as a Markdown table (printed by `cli.py bench`, pasted in docs)."""
from __future__ import annotations

from . import structured_rows


def table(r: dict) -> str:
    m, s, p, t = r["memory"], r["sharing"], r["prefix_caching"], r["throughput"]
    mib = 1 << 20
    rows = [
        ("memory", f"KV bytes for all {m['requests']} requests at once: tinypaged vs contiguous "
         f"({m['max_model_len']} tokens each)",
         f"{m['tinypaged_bytes_all_requests'] / mib:.0f} MiB vs "
         f"{m['contiguous_bytes_all_requests'] / mib:.0f} MiB"),
        ("memory", "waste: slots reserved but empty, at each request's full length",
         f"{m['tinypaged_waste_pct_final']:.1f}% vs {m['contiguous_waste_pct_final']:.1f}%"),
        ("memory", "tinypaged waste averaged over the run (1 - KV utilisation)",
         f"{m['tinypaged_waste_pct_run_avg']:.1f}%"),
        ("memory", "tinypaged waste at full length with block size 8 / 16 / 32",
         " / ".join(f"{v:.1f}%" for v in m["tinypaged_waste_pct_final_by_block_size"].values())),
        ("memory", f"requests at once in a {m['kv_budget_bytes'] / mib:.0f} MiB KV budget",
         f"{m['fit_at_once_tinypaged']} vs {m['fit_at_once_contiguous']}"),
        ("sharing", f"n=8 samples, {s['prompt_tokens']}-token prompt + {s['new_tokens']} new: "
         f"peak blocks vs 8 independent", f"{s['parallel_n8_blocks']} vs "
         f"{s['parallel_n8_independent_blocks']} ({s['parallel_saving_pct']:.0f}% saved)"),
        ("sharing", "beam width 4, same prompt: peak blocks vs unshared beams",
         f"{s['beam4_blocks']} vs {s['beam4_independent_blocks']} "
         f"({s['beam_saving_pct']:.0f}% saved)"),
        ("prefix caching", "16 chat requests: prefill tokens computed, on vs off",
         f"{p['on']['prefill_tokens_computed']} vs {p['off']['prefill_tokens_computed']} "
         f"(x{p['computed_ratio']:.3f})"),
        ("prefix caching", "time to first token (mean), on vs off",
         f"{p['on']['ttft_mean_s']:.2f} s vs {p['off']['ttft_mean_s']:.2f} s"),
        ("prefix caching", "total time, on vs off",
         f"{p['on']['total_s']:.2f} s vs {p['off']['total_s']:.2f} s"),
    ]
    for c, rate in t["decode_tokens_per_s"].items():
        rows.append(("throughput", f"decode, {c} concurrent requests", f"{rate:.0f} tokens/s"))
    wp, wc = t["workload_paged"], t["workload_contiguous"]
    rows += [("throughput", f"{m['requests']}-request workload: tinypaged (paged)",
              f"{wp['seconds']:.1f} s ({wp['tokens_per_s']:.0f} tokens/s, up to "
              f"{wp['peak_running']} at once)"),
             ("throughput", f"same, contiguous cache in the same budget "
              f"(at most {t['contiguous_max_concurrent']} at once)",
              f"{wc['seconds']:.1f} s ({wc['tokens_per_s']:.0f} tokens/s; paged "
              f"x{wc['seconds'] / wp['seconds']:.2f} faster)")]
    sp = r.get("sampling")
    if sp:
        rates = sp["tokens_per_s"]
        rows.append(("sampling", f"decode, {sp['concurrency']} concurrent: greedy vs "
                     f"temperature 0.8 + top-p 0.9", f"{rates['greedy']:.0f} vs {rates['top_p']:.0f} "
                     f"tokens/s (x{sp['top_p_vs_greedy']:.2f})"))
    rows += structured_rows.report_rows(r)
    for name, f in r.get("weight_formats", {}).items():
        rss = f.get("generate_peak_rss")
        rows.append(("weights", f"{name}: decode at batch 1 / 32 concurrent, weight bytes"
                     + (", `generate` peak RSS" if rss else ""),
                     f"{f['batch1_tokens_per_s']:.0f} / {f['concurrent32_tokens_per_s']:.0f} "
                     f"tokens/s, {f['weight_bytes'] / mib:.0f} MiB"
                     + (f", {rss / mib:.0f} MiB" if rss else "")))
    peer = r.get("llama_cpp")
    if peer:
        gguf = r["weight_formats"].get("gguf", {})
        b1 = peer["batch1"]["tokens_per_s"]
        ratio = f" (tinypaged x{gguf['batch1_tokens_per_s'] / b1:.2f})" if gguf else ""
        rows.append(("weights", "llama.cpp llama-bench, same GGUF, 2 threads: batch 1",
                     f"{b1:.0f} tokens/s{ratio}"))
        if "concurrent32" in peer:
            c32 = peer["concurrent32"]["tokens_per_s"]
            ratio = f" (tinypaged x{gguf['concurrent32_tokens_per_s'] / c32:.2f})" if gguf else ""
            rows.append(("weights", "llama.cpp llama-batched-bench: 32 concurrent",
                         f"{c32:.0f} tokens/s{ratio}"))
    hf = t.get("hf_transformers")
    if hf:
        rows += [("throughput", f"HF transformers generate, batch 1 ({hf['batch1_requests']} requests)",
                  f"{hf['batch1_tokens_per_s']:.1f} tokens/s"),
                 ("throughput", f"HF transformers generate, padded batch of {hf['padded_batch']}",
                  f"{hf['padded_tokens_per_s']:.1f} tokens/s; workload ~"
                  f"{hf['workload_seconds_estimated_padded']:.0f} s at that rate")]
    else:
        rows.append(("throughput", "HF transformers", "not installed (optional `bench` extra)"))
    lines = ["| area | figure | value |", "|---|---|---|"]
    lines += [f"| {a} | {f} | {v} |" for a, f, v in rows]
    return "\n".join(lines)

"""Speculative decoding (speculative_config "ngram") against plain decoding, in one
process: greedy, batch 1, copy-heavy chat workloads and free text, each run with and
without speculation, alternated; tokens/s, the ratio, the acceptance rate and the
mean accepted length a verification (with the target's own token), and whether the
tokens are the same (they must be).

Both modes run on one engine, its speculation switched off for the plain runs: a
second engine in the process would leave its idle OpenMP team spinning on the cores
the measured one needs (measured: a plain step 5.9 ms alone, 11-12 ms beside it).

    python bench/speculative.py [--models smollm2,gemma3] [--rounds 3] [--k 7] [--lookup 2,4]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tinypaged import LLM, SamplingParams  # noqa: E402

MODELS = {"smollm2": "weights/SmolLM2-135M-Instruct.Q4_1.gguf",
          "gemma3": "weights/gemma-3-270m-q4_k_m.gguf"}

CODE = '''import json


def load_orders(path):
    with open(path) as f:
        return json.load(f)


def order_total(order):
    total = 0.0
    for line in order["lines"]:
        total += line["price"] * line["quantity"]
    return total


def orders_report(orders):
    rows = []
    for order in orders:
        rows.append((order["id"], order_total(order)))
    rows.sort(key=lambda row: row[1], reverse=True)
    return rows


if __name__ == "__main__":
    orders = load_orders("orders.json")
    for order_id, total in orders_report(orders):
        print(order_id, round(total, 2))
'''

DOCUMENT = ("The lighthouse stood at the end of the pier for more than a hundred years. Every "
            "night the keeper climbed the narrow stairs, trimmed the wick and wound the clock "
            "that turned the lens. Ships passing the headland saw the light sweep across the "
            "water every ten seconds, and they knew where the rocks were. When the keeper grew "
            "old, his daughter took over the work, and she kept the light burning through the "
            "great storm of the winter when the harbour froze.")

RECORDS = "\n".join(f"name: {n}; city: {c}; age: {a}" for n, c, a in (
    ("Alice Martin", "Lyon", 34), ("Bruno Keller", "Basel", 41), ("Chiara Rossi", "Turin", 29),
    ("David Chen", "Toronto", 52), ("Elena Petrova", "Sofia", 37), ("Farid Haddad", "Beirut", 45),
    ("Greta Olsen", "Bergen", 31), ("Hugo Silva", "Porto", 26)))

WORKLOADS = {
    "code rename": "Rename the function order_total to order_sum everywhere in this code and "
                   "print the whole code:\n\n" + CODE,
    "document edit": "Repeat this text exactly, but replace 'keeper' with 'warden':\n\n" + DOCUMENT,
    "records to CSV": "Rewrite these records as CSV with a header line name,city,age:\n\n" + RECORDS,
    "free text": "Write a story about a fox who learns to sail.",
}


def run(llm, messages, params):
    """(tokens/s, token ids) of one chat request; a model without a chat template (the
    Gemma 3 270M GGUF) takes the text as a plain prompt."""
    start = time.perf_counter()
    if llm.engine.tokenizer.chat_template is None:
        out = llm.generate([messages[0]["content"] + "\n\n"], params)[0].outputs[0]
    else:
        out = llm.chat([messages], params)[0].outputs[0]
    return len(out.token_ids) / (time.perf_counter() - start), out.token_ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, default=7, help="num_speculative_tokens")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--lookup", default="2,4", help="prompt_lookup_min,prompt_lookup_max")
    args = ap.parse_args()
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    low, high = (int(n) for n in args.lookup.split(","))
    config = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": high,
              "prompt_lookup_min": low}
    print("| model | workload | plain tokens/s | speculative | ratio | acceptance | mean accepted | tokens | same |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        path = os.path.join(ROOT, MODELS[name])
        llm = LLM(path, backend="cpu", speculative_config=config)
        scheduler, speculation = llm.engine.scheduler, llm.engine.speculation
        run(llm, [{"role": "user", "content": "Hello"}], params)  # (warm up)
        for workload, text in WORKLOADS.items():
            messages = [{"role": "user", "content": text}]
            rates = {"plain": [], "spec": []}
            tokens = {}
            before = dict(speculation.as_dict())
            for r in range(args.rounds):
                for label in (("plain", "spec") if r % 2 == 0 else ("spec", "plain")):
                    scheduler.speculation = speculation if label == "spec" else None
                    rate, ids = run(llm, messages, params)
                    rates[label].append(rate)
                    tokens.setdefault(label, ids)
            after = speculation.as_dict()
            drafts = after["spec_num_drafts"] - before["spec_num_drafts"]
            proposed = after["spec_num_draft_tokens"] - before["spec_num_draft_tokens"]
            accepted = after["spec_num_accepted_tokens"] - before["spec_num_accepted_tokens"]
            p, s = float(np.median(rates["plain"])), float(np.median(rates["spec"]))
            print(f"| {name} | {workload} | {p:.1f} | {s:.1f} | **{s / p:.2f}x** | "
                  f"{accepted / max(1, proposed):.2f} | {1 + accepted / max(1, drafts):.2f} | "
                  f"{len(tokens['plain'])} | {tokens['plain'] == tokens['spec']} |", flush=True)


if __name__ == "__main__":
    main()

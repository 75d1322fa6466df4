"""Speculative decoding (speculative_config "ngram") against plain decoding, in one
process: greedy, batch 1, copy-heavy chat workloads and free text, each run with and
without speculation, alternated; tokens/s, the ratio, the acceptance rate and the
mean accepted length a verification (with the target's own token), and whether the
tokens are the same (they must be).

Both modes run on one engine, its speculation switched off for the plain runs: a
second engine in the process would leave its idle OpenMP team spinning on the cores
the measured one needs (measured: a plain step 5.9 ms alone, 11-12 ms beside it).

    python bench/speculative.py [--models smollm2,gemma3] [--rounds 3] [--k 7] [--lookup 2,4]
        [--concurrent 32] [--draft smollm2] [--llama-server PATH [--spec-types ...]]

    (a draft pair: --models smollm2-f16-gguf --draft smollm2 --k 3; with --llama-server,
     its --model-draft on the same two files)

With --llama-server, the same requests then go to llama.cpp's server on the same file
(2 threads), once per --spec-types mode, one server at a time: tokens/s over each
request's wall time, as ours (prefill included), and its draft figures.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tinypaged import LLM, SamplingParams  # noqa: E402

MODELS = {"smollm2": "weights/SmolLM2-135M-Instruct.Q4_1.gguf",
          "smollm2-f16": "weights/smollm2-135m-instruct",
          # the same weights as a float16 GGUF, so llama-server can run the draft pair too
          # (made from the Q4_1 file by llama-quantize: DERIVED)
          "smollm2-f16-gguf": "weights/derived/SmolLM2-135M-Instruct.F16.gguf",  # (the float16 folder pull converts)
          "gemma3": "weights/gemma-3-270m-q4_k_m.gguf",
          # Llama-3.2-1B's shapes with random weights (bench/shaped_models.py): text that
          # never repeats, so what speculation costs where it finds nothing to propose
          "llama1b": "weights/shaped/llama-3.2-1b.Q4_K_M.gguf"}

DERIVED = {"smollm2-f16-gguf": ("smollm2", "F16")}  # name -> (made from, llama-quantize's type)


def model_path(name: str, llama_server: str | None) -> str:
    """The file of MODELS[name]; a DERIVED one is made first where it is missing, by the
    llama-quantize beside llama_server."""
    path = os.path.join(ROOT, MODELS[name])
    if os.path.exists(path) or name not in DERIVED:
        return path
    source, kind = DERIVED[name]
    quantize = os.path.join(os.path.dirname(llama_server or ""), "llama-quantize")
    command = [quantize, "--allow-requantize", os.path.join(ROOT, MODELS[source]), path, kind]
    if not llama_server or not os.path.exists(quantize):
        raise SystemExit(f"{path} is missing; make it with: {' '.join(command)}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return path


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


def concurrent_rates(llm, speculation, n: int, rounds: int, params) -> tuple[float, float, bool]:
    """(plain tokens/s, speculative tokens/s, same tokens) of n requests at once, the
    workloads in turn, on one engine with its speculation off and on, alternated."""
    texts = [list(WORKLOADS.values())[i % len(WORKLOADS)] for i in range(n)]
    rates, tokens = {"plain": [], "spec": []}, {}
    for r in range(rounds):
        for label in (("plain", "spec") if r % 2 == 0 else ("spec", "plain")):
            llm.engine.scheduler.speculation = speculation if label == "spec" else None
            start = time.perf_counter()
            if llm.engine.tokenizer.chat_template is None:
                outs = llm.generate([t + "\n\n" for t in texts], params)
            else:
                outs = llm.chat([[{"role": "user", "content": t}] for t in texts], params)
            ids = [o.outputs[0].token_ids for o in outs]
            rates[label].append(sum(map(len, ids)) / (time.perf_counter() - start))
            tokens.setdefault(label, ids)
    llm.engine.scheduler.speculation = speculation
    return (float(np.median(rates["plain"])), float(np.median(rates["spec"])),
            tokens["plain"] == tokens["spec"])


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def llama_server_rates(binary: str, model: str, spec_type: str, rounds: int, max_tokens: int,
                       chat: bool, draft: tuple[str, int] | None = None) -> dict:
    """workload -> (median tokens/s, completion tokens, drafted, accepted) from llama-server
    in mode spec_type, greedy; chat: through its chat template, else the plain prompt.
    draft: (the draft's file, most proposals) for spec_type "draft-simple"."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = [binary, "-m", model, "-t", "2", "-c", "4096", "--port", str(port), "-np", "1"]
    if spec_type != "none":
        args += ["--spec-type", spec_type]
    if spec_type.startswith("draft"):
        args += ["--model-draft", draft[0], "--spec-draft-n-max", str(draft[1]), "-td", "2"]
    server = subprocess.Popen(args,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):  # (loading: /health answers 200 once the model is in)
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        out = {}
        for workload, text in WORKLOADS.items():
            rates, drafted, accepted, tokens = [], 0, 0, 0
            for _ in range(rounds):
                body = {"temperature": 0, "max_tokens": max_tokens, "cache_prompt": False}
                start = time.perf_counter()
                if chat:
                    reply = _post(url + "/v1/chat/completions",
                                  {**body, "messages": [{"role": "user", "content": text}]})
                else:
                    reply = _post(url + "/v1/completions", {**body, "prompt": text + "\n\n"})
                tokens = reply["usage"]["completion_tokens"]
                rates.append(tokens / (time.perf_counter() - start))
                timings = reply.get("timings", {})
                drafted += timings.get("draft_n", 0)
                accepted += timings.get("draft_n_accepted", 0)
            out[workload] = (float(np.median(rates)), tokens, drafted, accepted)
        return out
    finally:
        server.terminate()
        server.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, default=7, help="num_speculative_tokens")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--lookup", default="2,4", help="prompt_lookup_min,prompt_lookup_max")
    ap.add_argument("--draft", help="a draft model (a name in MODELS) in place of prompt lookup")
    ap.add_argument("--concurrent", type=int, default=32,
                    help="a row of this many requests at once (0: none)")
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary: measure it too")
    ap.add_argument("--spec-types", help="llama-server's --spec-type modes to measure (default: "
                    "none,ngram-simple,ngram-mod; with --draft none,draft-simple)")
    args = ap.parse_args()
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    low, high = (int(n) for n in args.lookup.split(","))
    config = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": high,
              "prompt_lookup_min": low}
    if args.draft:  # a draft model proposes instead (its name in MODELS)
        config = {"method": "draft_model", "model": model_path(args.draft, args.llama_server),
                  "num_speculative_tokens": args.k}
    # "ratio": tokens/s over each request's wall time, its prompt included (as llama-server's
    # figures are taken); "decode": the same runs less the prompt's time to its first
    # token; "fewer steps": plain steps over speculative ones, the ratio speculation would
    # give if a step with proposals cost what a plain step costs (its bound on these tokens)
    print("| model | workload | plain tokens/s | speculative | ratio | decode | fewer steps "
          "| acceptance | mean accepted | tokens | same |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        path = model_path(name, args.llama_server)
        # (no prefix cache: each run reads its whole prompt, so that a float model's
        #  first token comes from the same products in every run and the tokens compare)
        llm = LLM(path, backend="cpu", speculative_config=config, enable_prefix_caching=False)
        scheduler, speculation = llm.engine.scheduler, llm.engine.speculation
        run(llm, [{"role": "user", "content": "Hello"}], params)  # (warm up)
        for workload, text in WORKLOADS.items():
            messages = [{"role": "user", "content": text}]
            rates = {"plain": [], "spec": []}
            tokens = {}
            before = dict(speculation.as_dict())
            steps = {}  # label -> engine steps of a run (the same every round)
            first = SamplingParams(temperature=0, max_tokens=1)  # the prompt's time to a token
            prefill = float(np.median([1 / run(llm, messages, first)[0] for _ in range(args.rounds)]))
            for r in range(args.rounds):
                for label in (("plain", "spec") if r % 2 == 0 else ("spec", "plain")):
                    scheduler.speculation = speculation if label == "spec" else None
                    first = llm.engine.statistics.steps
                    rate, ids = run(llm, messages, params)
                    steps[label] = llm.engine.statistics.steps - first
                    rates[label].append(rate)
                    tokens.setdefault(label, ids)
            after = speculation.as_dict()
            drafts = after["spec_num_drafts"] - before["spec_num_drafts"]
            proposed = after["spec_num_draft_tokens"] - before["spec_num_draft_tokens"]
            accepted = after["spec_num_accepted_tokens"] - before["spec_num_accepted_tokens"]
            p, s = float(np.median(rates["plain"])), float(np.median(rates["spec"]))
            n = len(tokens["plain"])  # decode alone: each run's seconds less the prompt's
            decode = (n / p - prefill) / (n / s - prefill)
            print(f"| {name} | {workload} | {p:.1f} | {s:.1f} | **{s / p:.2f}x** | {decode:.2f}x | "
                  f"{steps['plain'] / steps['spec']:.2f}x | {accepted / max(1, proposed):.2f} | "
                  f"{1 + accepted / max(1, drafts):.2f} | {len(tokens['plain'])} | "
                  f"{tokens['plain'] == tokens['spec']} |", flush=True)
        if args.concurrent:
            p, s, same = concurrent_rates(llm, speculation, args.concurrent, args.rounds, params)
            print(f"| {name} | {args.concurrent} concurrent (the four in turn) | {p:.1f} | {s:.1f} | "
                  f"**{s / p:.2f}x** | | | | | | {same} |", flush=True)
        if args.llama_server:
            chat = llm.engine.tokenizer.chat_template is not None
            llm.close()
            spec_types = args.spec_types or ("none,draft-simple" if args.draft
                                             else "none,ngram-simple,ngram-mod")
            draft = (config.get("model"), args.k)
            for spec_type in spec_types.split(","):
                rates = llama_server_rates(args.llama_server, path, spec_type, args.rounds,
                                           args.max_tokens, chat, draft)
                for workload, (rate, n, drafted, accepted) in rates.items():
                    print(f"| {name} llama-server {spec_type} | {workload} | | {rate:.1f} | | | | "
                          f"{accepted / max(1, drafted):.2f} | | {n} | |", flush=True)


if __name__ == "__main__":
    main()

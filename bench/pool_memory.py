"""Resident memory as distinct requests rotate through the KV pool (stories260K, CPU).

The pool is allocated once, but the OS maps its pages only when first written. With
prefix caching, freed blocks keep their content and the allocator takes never-used
blocks first, so RSS climbs until the whole pool has been touched: what bounds it is
the pool's size. Runs four rounds of 256 distinct prompts with the default pool (sized
for max_num_seqs x max_model_len) and with the rule before issue 9 (a fifth of free
RAM), each in a fresh process, and prints RSS after each round.

Usage: python bench/pool_memory.py [--rounds 4] [--requests 256]
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

STORIES = os.path.join(os.path.dirname(__file__), "..", "tests", "models", "stories260K")

CHILD = """
import json, sys
sys.path.insert(0, {root!r})
from tinypaged import LLM, SamplingParams
from tinypaged.config import DEFAULT_KV_MEMORY_FRACTION, available_memory_bytes

def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

options = {{"backend": "cpu"}}
if {old_rule}:
    options["kv_cache_memory"] = int(available_memory_bytes() * DEFAULT_KV_MEMORY_FRACTION)
llm = LLM({model!r}, **options)
params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
rows = [("loaded", rss_mib())]
for r in range({rounds}):
    prompts = [f"Round {{r}} story {{i}}: once upon a time there was a" for i in range({requests})]
    llm.generate(prompts, params)
    rows.append((f"round {{r + 1}}", rss_mib()))
print(json.dumps({{"pool_mib": llm.stats()["kv_cache_bytes"] / 2 ** 20, "rows": rows}}))
"""


def run(old_rule: bool, rounds: int, requests: int) -> dict:
    root = os.path.join(os.path.dirname(__file__), "..")
    code = CHILD.format(root=root, model=STORIES, old_rule=old_rule, rounds=rounds,
                        requests=requests)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=256)
    args = parser.parse_args()
    results = {name: run(old, args.rounds, args.requests)
               for name, old in (("before: a fifth of free RAM", True), ("now: the default", False))}
    names = list(results)
    print(f"{'RSS (MiB)':12}" + "".join(f"{n:>32}" for n in names))
    print(f"{'pool':12}" + "".join(f"{results[n]['pool_mib']:>32.0f}" for n in names))
    for i, (label, _) in enumerate(results[names[0]]["rows"]):
        print(f"{label:12}" + "".join(f"{results[n]['rows'][i][1]:>32.0f}" for n in names))


if __name__ == "__main__":
    main()

"""lm-eval-harness itself against `cli.py serve`: a small multiple-choice task scored
by lm-eval's local-completions model through the server, and by its hf model
(HF transformers in the same run), item by item.

Needs a Python with lm-eval and torch (`pip install "lm-eval[api]" torch transformers`),
given as --lm-eval-python; the server runs in this Python. No hub: the task is a
local JSON file written here, the model a local HF folder (stories260K by default;
lm-eval's hf model needs a tokenizer_config.json, which a copy gets if the folder
lacks one).

lm-eval's API models encode without the BOS its hf model adds (the tokenizer's
default), so both are told add_bos_token=True: the same tokens either way.

Usage: python bench/lm_eval_parity.py --lm-eval-python /path/to/venv/bin/python
                                      [--model tests/models/stories260K]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CONTEXTS = ["Once upon a time, there was a little", "Lily wanted to play with her",
            "The sun was shining and the", "Tom saw a big red",
            "One day, a girl named Sue went to the", "The dog ran to the",
            "She was very happy because she had a new", "Mom said, \"Let's go to the",
            "The little bird could not", "He looked at the sky and saw a",
            "They played in the park all", "The cat was hungry, so it",
            "Ben and Mia found a shiny", "At night, the moon was", "The boy said sorry to his",
            "The tree was tall and", "Sara liked to eat", "The car went very",
            "Grandma gave her a warm", "The fish swam in the"]
CHOICES = [" girl", " dog", " park", " ball", " day", " happy", " toy", " store"]
TASK = """task: tinypaged_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def write_task(folder: str) -> None:
    data = os.path.join(folder, "mc.jsonl")
    with open(data, "w") as f:
        for i, context in enumerate(CONTEXTS):
            choices = [CHOICES[(i + k) % len(CHOICES)] for k in range(4)]
            f.write(json.dumps({"context": context, "choices": choices, "label": i % 4}) + "\n")
    with open(os.path.join(folder, "mc.yaml"), "w") as f:
        f.write(TASK.format(data=data))


def model_for_hf(model: str, folder: str) -> str:
    """model, or a copy of it (links) with a tokenizer_config.json naming its specials."""
    if os.path.exists(os.path.join(model, "tokenizer_config.json")):
        return model
    copy = os.path.join(folder, "model")
    os.makedirs(copy)
    for name in os.listdir(model):
        os.symlink(os.path.abspath(os.path.join(model, name)), os.path.join(copy, name))
    with open(os.path.join(model, "tokenizer.json")) as f:
        added = {t["id"]: t["content"] for t in json.load(f).get("added_tokens", [])}
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(copy, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast",
                   "bos_token": added.get(config.get("bos_token_id")),
                   "eos_token": added.get(config.get("eos_token_id"))}, f)
    return copy


def run_lm_eval(python: str, folder: str, name: str, model: str, model_args: str) -> dict:
    """lm-eval's per-item samples, by doc id."""
    out = os.path.join(folder, name)
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cmd = [python, "-m", "lm_eval", "--model", model, "--model_args", model_args,
           "--include_path", folder, "--tasks", "tinypaged_mc", "--log_samples",
           "--output_path", out, "--device", "cpu"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"lm-eval ({name}) failed:\n{done.stderr[-3000:]}")
    (samples,) = glob.glob(os.path.join(out, "*", "samples_*.jsonl"))
    with open(samples) as f:
        return {r["doc_id"]: r for r in map(json.loads, f)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lm-eval-python", required=True)
    ap.add_argument("--model", default=os.path.join(ROOT, "tests", "models", "stories260K"))
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="lm_eval_parity-")
    write_task(folder)
    hf_model = model_for_hf(args.model, folder)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    log = open(os.path.join(folder, "server.log"), "w")
    server = subprocess.Popen([sys.executable, os.path.join(ROOT, "cli.py"), "serve", "--model",
                               args.model, "--port", str(port), "--served-model-name", "m"],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.5)
        api = run_lm_eval(args.lm_eval_python, folder, "api", "local-completions",
                          f"model=m,base_url=http://127.0.0.1:{port}/v1/completions,"
                          f"tokenizer_backend=huggingface,tokenizer={hf_model},"
                          f"num_concurrent=4,max_retries=1,add_bos_token=True")
    finally:
        server.terminate()
        server.wait(30)
    hf = run_lm_eval(args.lm_eval_python, folder, "hf", "hf",
                     f"pretrained={hf_model},dtype=float32,add_bos_token=True")
    worst, count, same_acc = 0.0, 0, 0
    for doc_id, row in hf.items():
        ours = [float(r[0][0]) for r in api[doc_id]["resps"]]
        theirs = [float(r[0][0]) for r in row["resps"]]
        worst = max([worst] + [abs(a - b) for a, b in zip(ours, theirs)])
        count += len(ours)
        same_acc += api[doc_id]["acc"] == row["acc"]
    acc = [sum(r["acc"] for r in rows.values()) / len(rows) for rows in (api, hf)]
    print(f"{count} loglikelihoods over {len(hf)} items: worst |server - hf| {worst:.2e} nats; "
          f"accuracy {acc[0]:.3f} (server) vs {acc[1]:.3f} (hf), {same_acc}/{len(hf)} items scored alike")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Dense reference path on SmolLM2: load time, time to first token, decode tokens/s.

The baseline the paged engine is measured against. Prints figures; asserts nothing.
Usage: python bench/bench_dense.py [--model DIR] [--tokens N]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tinypaged.model.reference import ReferenceModel  # noqa: E402
from tinypaged.model.loading import load_model  # noqa: E402
from tinypaged.pull import default_model_dir  # noqa: E402
from tinypaged.tokenizer import Tokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()

    model_dir = args.model or default_model_dir()
    start = time.perf_counter()
    cfg, weights = load_model(model_dir)
    model = ReferenceModel(cfg, weights)
    prompt_ids = Tokenizer(model_dir).encode("The history of the river Thames begins")
    load_seconds = time.perf_counter() - start
    cache = model.new_cache(len(prompt_ids) + args.tokens + 1)
    t0 = time.perf_counter()
    logits = model.forward(prompt_ids, cache, all_logits=False)
    ttft = time.perf_counter() - t0
    token = int(logits[-1].argmax())
    t1 = time.perf_counter()
    for _ in range(args.tokens):
        token = int(model.forward([token], cache)[-1].argmax())
    decode = time.perf_counter() - t1

    weight_bytes = sum(w.nbytes for name, w in model.w.items()
                       if name != "lm_head.weight" or not cfg.tie_word_embeddings)
    print(f"model            {model_dir}")
    print(f"load             {load_seconds:.2f} s")
    print(f"prefill          {len(prompt_ids)} tokens in {ttft * 1e3:.1f} ms (time to first token)")
    print(f"decode batch 1   {args.tokens / decode:.1f} tokens/s ({decode / args.tokens * 1e3:.1f} ms/token)")
    print(f"weights read     {weight_bytes / 1e6:.0f} MB per decode step (float32)")
    print(f"  -> {weight_bytes * args.tokens / decode / 1e9:.1f} GB/s effective")


if __name__ == "__main__":
    main()

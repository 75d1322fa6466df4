"""Where a step's time goes (CPU backend): each backend op timed, the matrix
products by weight kind, the Python between ops inside the forward, and what lies
outside it (sampling, scheduling, bookkeeping).

Every op of the model's backend module is wrapped by a timer (a proxy set as the
model's `ops`), then --requests requests (1: batch 1) decode --steps tokens each;
the prefill steps are left out (--phase decode) or are the ones timed (--phase
prefill). --prompt-len N: prompts of N random tokens (long contexts; a prefill of
N tokens) instead of a short one. Timers cost ~1 us a call, counted in "python
between ops".

--proposals K: each decode step verifies K forced proposals a request (1 + K
decode rows, speculation.py; nearly all rejected): what a verification's rows cost.

Usage: python bench/profile_step.py MODEL [--steps 64] [--requests 1] [--prompt-len N]
       [--phase decode|prefill] [--kv-cache-dtype auto|float16|float32] [--proposals K]
Prints a table; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tinypaged import LLM, SamplingParams  # noqa: E402
from tinypaged.config import KV_CACHE_DTYPES  # noqa: E402
from tinypaged.bench.long_rates import random_prompt  # noqa: E402
from tinypaged.bench.rates import commit_kv_pool, on_engine_thread  # noqa: E402

WEIGHT_OPS = {"linear": 1, "qkv_proj": 1, "gate_up_silu": 1, "gate_up_gelu": 1}  # op -> weight arg


def kind_of(weight) -> str:
    """A weight's form: its kind's name (formats/weight.py), else its dtype."""
    kind = getattr(weight, "kind", None)
    return kind.name if kind is not None else str(getattr(weight, "dtype", type(weight).__name__))


class TimedOps:
    """The backend module's ops, each call timed into `seconds` (keyed by op, and by
    weight kind and output width for the matrix products)."""

    def __init__(self, ops):
        self._ops = ops
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def __getattr__(self, name):
        op = getattr(self._ops, name)
        if not callable(op):
            return op

        def timed(*args, **kwargs):
            key = name
            if name in WEIGHT_OPS:
                weight = args[WEIGHT_OPS[name]]
                key = f"{name} {kind_of(weight)} {tuple(weight.shape)}"
            start = time.perf_counter()
            out = op(*args, **kwargs)
            self.seconds[key] += time.perf_counter() - start
            self.calls[key] += 1
            return out
        return timed


def profile(model: str, steps: int, requests: int, prompt_len: int, phase: str,
            kv_dtype: str, proposals: int = 0) -> None:
    # the pool for these requests, sliding-window groups' blocks included, written once
    # before timing, as llama.cpp's is at load (rates.commit_kv_pool)
    blocks_a_request = -(-(max(prompt_len, 16) + steps + 16) // 16)
    llm = LLM(model, backend="cpu", kv_cache_dtype=kv_dtype, max_num_seqs=max(requests, 1),
              max_model_len=prompt_len + steps + 64 if prompt_len else None,
              num_blocks=max(256, 4 * max(requests, 1) * blocks_a_request),
              speculative_config={"method": "ngram", "num_speculative_tokens": proposals}
              if proposals else None)
    commit_kv_pool(llm)
    prompts = [random_prompt(prompt_len, llm.config.vocab_size) if prompt_len else "Once upon a time"
               for _ in range(requests)]

    def warm_up(engine):  # the same shapes once, untimed: kernels compiled or loaded
        for prompt in prompts:
            engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
    on_engine_thread(llm, warm_up)
    prompts = [random_prompt(prompt_len, llm.config.vocab_size) if prompt_len else "Once upon a time"
               for _ in range(requests)]  # (fresh ones: no prefix cache hits)

    def work(engine):
        model_ = engine.runner.model
        timed = TimedOps(model_.ops)
        forward_s = [0.0]
        forward = model_.forward_on_device

        def timed_forward(*args, **kwargs):
            start = time.perf_counter()
            out = forward(*args, **kwargs)
            forward_s[0] += time.perf_counter() - start
            return out
        for prompt in prompts:
            engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=steps + 1,
                                                      ignore_eos=True))
        if phase == "decode":
            while not any(o.outputs for o in engine.step()):  # the prefill, untimed
                pass
        model_.ops, model_.forward_on_device = timed, timed_forward
        if proposals:  # (token 3 proposed, whatever the text)
            engine.speculation.sizer.choose = lambda rates, plain: [proposals] * len(rates)
            engine.speculation.proposer.propose_all = lambda seqs, limits: [[3] * k for k in limits]
        try:
            start = time.perf_counter()
            n = 0
            while engine.has_unfinished():
                outs = engine.step()
                n += 1
                if phase == "prefill" and any(o.outputs for o in outs):
                    break
            total = time.perf_counter() - start
        finally:
            model_.ops, model_.forward_on_device = timed._ops, forward
        return timed, forward_s[0], total, n
    timed, forward_s, total, n = on_engine_thread(llm, work)
    llm.close()
    ms = lambda s: 1000 * s / n  # noqa: E731  (per step)
    rate = requests * (prompt_len if phase == "prefill" else n) / total
    verifying = f", {proposals} proposals each" if proposals else ""
    print(f"{model}: {n} {phase} steps of {requests} requests{verifying}, {ms(total):.2f} ms a step "
          f"({rate:.1f} tokens/s); {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}")
    print("| part | ms a step | calls a step | share |\n|---|---|---|---|")
    ops_s = sum(timed.seconds.values())
    for key, s in sorted(timed.seconds.items(), key=lambda kv: -kv[1]):
        print(f"| {key} | {ms(s):.3f} | {timed.calls[key] / n:.0f} | {100 * s / total:.1f}% |")
    print(f"| python between ops (forward) | {ms(forward_s - ops_s):.3f} | | "
          f"{100 * (forward_s - ops_s) / total:.1f}% |")
    print(f"| outside the forward (sampling, scheduling, outputs) | {ms(total - forward_s):.3f} | | "
          f"{100 * (total - forward_s) / total:.1f}% |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--requests", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=0)
    parser.add_argument("--phase", choices=["decode", "prefill"], default="decode")
    parser.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto")
    parser.add_argument("--proposals", type=int, default=0)
    args = parser.parse_args()
    if args.phase == "prefill" and not args.prompt_len:
        parser.error("--phase prefill needs --prompt-len")
    profile(args.model, args.steps, args.requests, args.prompt_len, args.phase, args.kv_cache_dtype,
            args.proposals)


if __name__ == "__main__":
    main()

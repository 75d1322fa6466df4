"""tinypaged beside llama.cpp on the same GGUF files, the same 2 threads, in one run:
decode at batch 1 and at 32 concurrent requests, prefill of 512 and 2,048-token
prompts, decode after a 4,096-token prompt, a second load, a cold start, and peak
memory at a 4,096-token context.

For each model the two engines take turns, --rounds times (this VM's speed drifts by
10-40% over tens of seconds, so a figure measured minutes from its peer's means
little); each row reports the medians and the ratio to llama.cpp.

Models: SmolLM2-135M-Instruct Q4_1 (the default model's GGUF) and Gemma 3 270M
Q4_K_M from weights/; random-weight files in the real shapes of Llama-3.2-1B,
Qwen3-0.6B and Llama-3.2-3B from weights/shaped/ (bench/shaped_models.py writes them).
llama.cpp: llama-bench (batch 1, prefill, depth), llama-batched-bench (32 sequences)
and llama-completion (whole runs) from one build folder; bench/NOTES.md has the build.

Rows (--rows):
  b1      batch-1 decode, 64 tokens (tokens/s)
  c32     32 concurrent requests decoding (tokens/s over all)
  pp512   prefill of a 512-token prompt (prompt tokens/s)
  pp2048  the same, 2,048 tokens
  d4096   batch-1 decode after a 4,096-token prompt (tokens/s)
  load    a second `generate` of one token, whole process (s); ours also prints the
          engine's own load time, llama.cpp its "load time"
  cold    the same with numba's cache empty (ours) (s)
  rss     peak RSS of a whole run of 32 tokens after a ~4,000-token prompt, with a
          4,096-token KV cache (MB)

Each engine row's notes give the VM's state before each run (tinypaged/bench/
cross_core.py: ns a cache line to read what the other core wrote; ~7 and ~45 on the
2-core VM, our c32 rates ~15% apart between them).

Usage: python bench/decode_peer.py --llama-bench PATH [--rounds 3] [--models a,b]
       [--rows b1,pp512] [--kv-cache-dtype auto|float16|float32]
Without --models/--rows: the rows issue 30 asks for, for each file present.
Prints a table; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tinypaged import LLM, SamplingParams  # noqa: E402
from tinypaged.config import KV_CACHE_DTYPES  # noqa: E402
from tinypaged.bench import llama_cpp_peer  # noqa: E402
from tinypaged.bench.cross_core import cross_core_ns  # noqa: E402
from tinypaged.bench.long_rates import decode_after_prompt, prefill_rate  # noqa: E402
from tinypaged.bench.peak_rss import timed_process  # noqa: E402
from tinypaged.bench.rates import commit_kv_pool, decode_rate, on_engine_thread  # noqa: E402
from tinypaged.model.kv_groups import blocks_for  # noqa: E402
from tinypaged.tokenizer import Tokenizer  # noqa: E402

WEIGHTS, SHAPED = ROOT / "weights", ROOT / "weights" / "shaped"
MODELS = {"smollm2": WEIGHTS / "SmolLM2-135M-Instruct.Q4_1.gguf",
          "gemma3": WEIGHTS / "gemma-3-270m-q4_k_m.gguf",
          "llama1b": SHAPED / "llama-3.2-1b.Q4_K_M.gguf", "llama1b-q8": SHAPED / "llama-3.2-1b.Q8_0.gguf",
          "qwen06": SHAPED / "qwen3-0.6b.Q4_K_M.gguf", "qwen06-q8": SHAPED / "qwen3-0.6b.Q8_0.gguf",
          "llama3b": SHAPED / "llama-3.2-3b.Q4_K_M.gguf", "llama3b-q8": SHAPED / "llama-3.2-3b.Q8_0.gguf"}
PLAN = {"smollm2": "b1,c32,pp512,pp2048,d4096,load,cold", "gemma3": "b1,c32,pp512,pp2048,d4096",
        "llama1b": "b1,c32,pp512,pp2048,load,rss", "llama1b-q8": "b1,c32,pp512",
        "qwen06": "b1,c32,pp512,pp2048,load", "llama3b": "b1,pp512"}
ENGINE_ROWS = ("b1", "c32", "pp512", "pp2048", "d4096")
UNITS = {"b1": "tokens/s", "c32": "tokens/s", "pp512": "tokens/s", "pp2048": "tokens/s",
         "d4096": "tokens/s", "load": "s", "cold": "s", "rss": "MB"}
CONTEXT = 4096
# The engine's pool, blocks of 16 tokens: what the rows take at once (a 4,224-token
# sequence; 32 of ~52 tokens), and a sliding-window model's window blocks, twice over;
# more where a long prompt in every KV group needs more (measure).
# It is written once before timing (commit_kv_pool), as llama.cpp's is at load, and
# sized as llama.cpp sizes its context, for the row rather than for every request a
# server might hold.
POOL_BLOCKS = 1024
BATCH1 = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
CONCURRENT = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
CLI = [sys.executable, str(ROOT / "cli.py"), "generate"]


def ours_engine(llm, row: str) -> float:
    if row == "b1":
        return decode_rate(llm, 1, BATCH1)
    if row == "c32":
        return decode_rate(llm, 32, CONCURRENT)
    if row.startswith("pp"):
        return prefill_rate(llm, int(row[2:]))
    return decode_after_prompt(llm, int(row[1:]))


def peer_engine(bench: Path, gguf: Path, row: str) -> float:
    if row == "b1":
        return llama_cpp_peer.decode_batch1(bench, gguf, repetitions=1)["tokens_per_s"]
    if row == "c32":
        return llama_cpp_peer.decode_concurrent(bench.parent / "llama-batched-bench", gguf)["tokens_per_s"]
    if row.startswith("pp"):
        return llama_cpp_peer.prefill(bench, gguf, int(row[2:]))
    return llama_cpp_peer.decode_at_depth(bench, gguf, int(row[1:]))


def long_prompt_file(gguf: Path, folder: Path, tokens: int) -> Path:
    """A one-line prompt of about `tokens` tokens (English prose, repeated)."""
    prose = (ROOT / "tests" / "data" / "prose.txt").read_text().replace("\n", " ")
    per_copy = len(Tokenizer(gguf).encode(prose))
    path = folder / f"prompt{tokens}.txt"
    path.write_text(" ".join([prose] * max(1, tokens // per_copy)))
    return path


def process_row(row: str, gguf: Path, bench: Path, folder: Path, kv_dtype: str) -> tuple:
    """(ours, peer, notes) of one whole-process row."""
    short = folder / "short.txt"
    short.write_text("The capital of France is")
    ours_cmd = [*CLI, "--model", str(gguf), "--temperature", "0", "--max-num-seqs", "1",
                "--max-model-len", str(CONTEXT), "--kv-cache-dtype", kv_dtype]
    env = dict(os.environ)
    if row == "rss":
        prompt, n_gen = long_prompt_file(gguf, folder, CONTEXT - 200), 32
    else:
        prompt, n_gen = short, 1
    if row == "cold":
        env["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(dir=folder)
    ours = timed_process([*ours_cmd, "--prompts-file", str(prompt), "--max-tokens", str(n_gen),
                          "--verbose"], env)
    peer = timed_process(llama_cpp_peer.completion_command(bench, gguf, prompt, CONTEXT, n_gen),
                         llama_cpp_peer.library_env(bench))
    if row == "rss":
        return ours["peak_rss"] / 1e6, peer["peak_rss"] / 1e6, ""
    loaded = re.search(r"loaded .* in ([0-9.]+) s", ours["output"])
    peer_load = re.search(r"load time =\s*([0-9.]+) ms", peer["output"])
    notes = (f"engine load {loaded.group(1) if loaded else '?'} s, llama.cpp load "
             f"{float(peer_load.group(1)) / 1000 if peer_load else float('nan'):.2f} s")
    return ours["seconds"], peer["seconds"], notes


def measure(name: str, rows: list[str], bench: Path, rounds: int, kv_dtype: str) -> dict:
    gguf = MODELS[name]
    runs = {row: ([], [], "") for row in rows}
    engine_rows = [r for r in rows if r in ENGINE_ROWS]
    if engine_rows:
        def engine(num_blocks):
            return LLM(str(gguf), backend="cpu", kv_cache_dtype=kv_dtype, max_num_seqs=32,
                       max_model_len=CONTEXT + 128, num_blocks=num_blocks)
        llm = engine(POOL_BLOCKS)
        blocks = llm.engine.block_manager
        need = blocks.num_groups * blocks_for(CONTEXT + 128, blocks.block_size)  # (a long prompt in every KV group)
        if need > POOL_BLOCKS:  # (Gemma 3: 6 groups of layers, 1,542 blocks for d4096's prompt)
            llm.close()
            llm = engine(need)
        commit_kv_pool(llm)
        for row in engine_rows:  # compiles every kernel for these shapes
            ours_engine(llm, row)
        states = {row: ([], []) for row in engine_rows}  # (cross_core.py: the VM's state, each run)
        state = lambda: on_engine_thread(llm, lambda _: cross_core_ns())  # noqa: E731
        for _ in range(rounds):
            for row in engine_rows:
                states[row][0].append(state())
                runs[row][0].append(ours_engine(llm, row))
                states[row][1].append(state())
                runs[row][1].append(peer_engine(bench, gguf, row))
        llm.close()
        for row, (ours, peer) in states.items():
            runs[row] = (*runs[row][:2], "cross-core ns a line before each run: ours " + ", ".join(
                f"{ns:.0f}" for ns in ours) + "; llama.cpp " + ", ".join(f"{ns:.0f}" for ns in peer))
    with tempfile.TemporaryDirectory() as folder:
        for row in (r for r in rows if r not in ENGINE_ROWS):
            if row == "load":  # the first load fills the page cache (and any layout cache)
                process_row(row, gguf, bench, Path(folder), kv_dtype)
            for _ in range(rounds):
                ours, peer, notes = process_row(row, gguf, bench, Path(folder), kv_dtype)
                runs[row][0].append(ours)
                runs[row][1].append(peer)
                runs[row] = (runs[row][0], runs[row][1], notes)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bench", required=True, type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default=None, help=f"of {', '.join(MODELS)}")
    parser.add_argument("--rows", default=None, help=f"of {', '.join(UNITS)}")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES)
    args = parser.parse_args()
    names = args.models.split(",") if args.models else list(PLAN)
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {args.rounds} rounds "
          f"alternated, medians; our KV cache {args.kv_cache_dtype}, llama.cpp's float16")
    print("| model | row | tinypaged | llama.cpp | ratio | unit | notes |\n|---|---|---|---|---|---|---|")
    for name in names:
        if not MODELS[name].is_file():
            print(f"| {name} | (no {MODELS[name].relative_to(ROOT)}) ||||||")
            continue
        rows = args.rows.split(",") if args.rows else PLAN.get(name, "b1").split(",")
        for row, (ours, peer, notes) in measure(name, rows, args.llama_bench, args.rounds,
                                                args.kv_cache_dtype).items():
            o, p = statistics.median(ours), statistics.median(peer)
            # the ratio says how many times better ours is: rates up, seconds and bytes down
            ratio = o / p if UNITS[row] == "tokens/s" else p / o
            print(f"| {name} | {row} | {o:.1f} | {p:.1f} | {ratio:.2f}x | {UNITS[row]} | {notes} |",
                  flush=True)
            print(f"  {name} {row} runs: ours " + ", ".join(f"{v:.1f}" for v in ours)
                  + "; llama.cpp " + ", ".join(f"{v:.1f}" for v in peer), file=sys.stderr)


if __name__ == "__main__":
    main()

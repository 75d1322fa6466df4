"""The commands: generate, serve, perplexity, bench, convert, pull. Each takes the
parsed arguments and imports only what it needs (a command's start is part of its
time to a first token)."""
from __future__ import annotations

import math
import os
import sys
import time

from .options import engine_options


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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
    from .. import StructuredOutputs

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
    from .. import LLM, SamplingParams

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
    options, lora = engine_options(args), None
    if args.lora:
        if args.beam_width:
            raise ValueError("--beam-width runs the base model: drop --lora or --beam-width")
        lora = "adapter"
        options["lora_modules"] = {**(options.get("lora_modules") or {}), lora: args.lora}
        options["max_loras"] = max(options["max_loras"], len(options["lora_modules"]))
    llm = LLM(args.model, **options)
    if args.verbose:
        _log(f"loaded {llm.model_dir} in {llm.load_seconds:.2f} s; KV pool: "
             f"{llm.stats()['blocks_total']} blocks of {args.block_size} tokens")
    if args.chat:  # (ids: the template writes its own special tokens, BOS among them)
        prompts = [llm.chat_prompt_ids([{"role": "user", "content": p}]) for p in prompts]
    start = time.perf_counter()
    if args.beam_width:
        for i, out in enumerate(llm.beam_search(prompts, args.beam_width, params.max_tokens,
                                                args.length_penalty, params.ignore_eos)):
            for rank, beam in enumerate(out.beams):
                print(f"--- prompt {i}, beam {rank} (cumulative logprob {beam.cum_logprob:.3f}, "
                      f"{beam.finish_reason}) ---\n{beam.text}")
    elif len(prompts) == 1 and params.n == 1:  # stream it
        first = None
        for delta in llm.stream(prompts[0], params, lora=lora):
            first = first or time.perf_counter()
            sys.stdout.write(delta)
            sys.stdout.flush()
        sys.stdout.write("\n")
        if args.verbose and first is not None:
            _log(f"first text after {first - start:.2f} s")
    else:  # a batch: print each completion when all are done
        for i, out in enumerate(llm.generate(prompts, params, lora=lora)):
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
    from ..pull import default_gguf
    from ..tokenizer import Tokenizer

    model_dir = args.model or default_gguf()
    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    start = time.perf_counter()
    ids = Tokenizer(model_dir).encode(text)
    if args.reference:  # the dense NumPy oracle, not the engine
        from ..model.reference import ReferenceModel
        from ..model.loading import load_model
        from ..perplexity import reference_nll

        nll = reference_nll(ReferenceModel(*load_model(model_dir)), ids, args.max_model_len)
    else:
        from .. import LLM
        from ..perplexity import engine_nll

        nll = engine_nll(LLM(model_dir, **engine_options(args)), ids)
    if args.verbose:
        _log(f"{len(ids)} tokens scored in {time.perf_counter() - start:.2f} s")
    print(f"perplexity: {float(math.exp(nll.mean())):.3f}")


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
        from ..serve.config import ServerConfig
        from ..serve.server import bind, serve
    except ImportError as e:
        raise ValueError(f"serve needs the 'serve' extra ({e.name} is missing): "
                         f"pip install 'tinypaged[serve]' (-e '.[serve]' in a checkout)") from None
    from .. import LLM

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
    from ..bench.report import table
    from ..bench.suite import run_all
    from ..pull import default_model_dir

    results = run_all(args.model or default_model_dir(), args.out, _log, args.llama_bench)
    print(table(results))
    print(f"\n(all figures also in {args.out})")


def cmd_convert(args) -> None:
    from ..model.gguf_convert import convert_gguf

    convert_gguf(args.gguf, args.out_dir, _log)


def cmd_pull(args) -> None:
    from ..pull import DEFAULT_MODEL_DIR, pull
    from ..pull_parts import PARTED_MODELS, pull_parted

    if args.name in PARTED_MODELS:
        if args.dir:
            raise ValueError(f"--dir is for the default model; {args.name} goes to weights/")
        pull_parted(PARTED_MODELS[args.name], _log)
    else:
        pull(args.dir or DEFAULT_MODEL_DIR, _log)

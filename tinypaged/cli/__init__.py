"""tinypaged's command line: `tinypaged generate|serve|perplexity|bench|convert|pull`
(the console script), `python -m tinypaged`, and the repository's cli.py.

Argument parsing only; defaults come from the library's dataclasses. A user's
mistake prints one line on stderr and exits with status 1 (2 for bad arguments).
"""
from __future__ import annotations

import sys

from .parser import build_parser


def main(argv: list[str] | None = None, prog: str = "tinypaged") -> int:
    """Run the command argv names (default: sys.argv's); the exit status."""
    args = build_parser(prog).parse_args(argv)
    try:
        args.func(args)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    return 0

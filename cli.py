"""tinypaged's command line from a checkout: `python cli.py generate ...`, the same
commands as the installed `tinypaged` (tinypaged/cli/)."""
import sys

from tinypaged.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="cli.py"))

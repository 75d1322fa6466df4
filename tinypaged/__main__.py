"""`python -m tinypaged ...`: the command line (cli/)."""
import sys

from .cli import main

sys.exit(main(prog="python -m tinypaged"))

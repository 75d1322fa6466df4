"""cached_njit: a kernel's on-disk cache goes stale when a module it compiles in changes.

Each run is a fresh process over a small package in tmp_path, so numba loads from its
cache or compiles, as a user's next run would.
"""
import os
import subprocess
import sys
import textwrap

from tinypaged.jit_cache import sources_digest

CALLER = """
from numba import njit
from tinypaged.jit_cache import cached_njit
from .callee import value

@cached_njit()
def answer():
    return value()

@njit(cache=True)
def plain_answer():  # numba's own cache, for contrast
    return value()

if __name__ == "__main__":
    print(answer(), plain_answer(), sum(answer.stats.cache_hits.values()))
"""

CALLEE = """
from numba import njit
from .constants import BASE

@njit
def value():
    return BASE + {n}
"""


def _write_package(root, n: int, base: int = 0):
    package = root / "kernelpkg"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "caller.py").write_text(textwrap.dedent(CALLER))
    (package / "callee.py").write_text(textwrap.dedent(CALLEE.format(n=n)))
    (package / "constants.py").write_text(f"BASE = {base}\n")


def _run(root):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a rewrite within a second must not reuse .pyc
    env["PYTHONPATH"] = os.pathsep.join([str(root), *sys.path])
    out = subprocess.run([sys.executable, "-m", "kernelpkg.caller"], cwd=root, env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    return [int(v) for v in out]


def test_a_change_in_a_compiled_in_module_recompiles_the_kernel(tmp_path):
    _write_package(tmp_path, n=1)
    assert _run(tmp_path) == [1, 1, 0]       # compiled, cached
    assert _run(tmp_path) == [1, 1, 1]       # loaded from the cache
    _write_package(tmp_path, n=2)
    answer, plain, hits = _run(tmp_path)
    assert (answer, hits) == (2, 0)          # the callee's change recompiles it
    assert plain == 1                        # numba's own stamp misses it: the hazard
    _write_package(tmp_path, n=2, base=10)   # a constant one import further (no numba)
    assert _run(tmp_path)[0] == 12


def test_the_lanes_products_digest_covers_their_ir_modules():
    from tinypaged import jit_cache
    closure = {os.path.basename(p) for p in jit_cache._closure("tinypaged.kernels.cpu.lanes_product")}
    assert {"lanes_ir.py", "byte_dot.py", "vector_ir.py", "kind_arg.py"} <= closure
    attention = {os.path.basename(p) for p in jit_cache._closure("tinypaged.kernels.cpu.attention")}
    assert {"attention_items.py", "attention_ir.py", "fast_exp.py"} <= attention
    assert len(sources_digest("tinypaged.kernels.cpu.lanes_product")) == 64

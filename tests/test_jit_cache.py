"""cached_njit: a kernel's on-disk cache goes stale when a module it compiles in changes.

Each run is a fresh process over a small package in tmp_path, so numba loads from its
cache or compiles, as a user's next run would.
"""
import json
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


PRELOADED = """
import json, pickle, sys
from numba import njit
from tinypaged import jit_cache
from tinypaged.jit_cache import cached_njit

@cached_njit()
def helper(x):  # (called only by answer: its code is in answer's)
    return x * 3

@cached_njit()
def answer(x):
    return helper(x) + 1

def llvm_resident_kib():
    kib, named = 0, False
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:
            named = len(fields) > 5 and "libllvmlite" in fields[5]
        elif named and fields[0] == "Rss:":
            kib += int(fields[1])
    return kib

if __name__ == "__main__":
    if sys.argv[1] == "first":
        print(answer(2))
        pickle.dump(jit_cache.called_signatures(), open(sys.argv[2], "wb"))
        print(" ".join(sorted(k.split(":")[1] for k in jit_cache.called_signatures())))
    else:
        loaded = jit_cache.preload(pickle.load(open(sys.argv[2], "rb")))
        before = llvm_resident_kib()
        gave = jit_cache.give_back_compiler_pages()
        after = llvm_resident_kib()
        value = answer(2)
        fresh = njit(lambda x: x - 1)(5)  # (a compile after: the compiler's pages come back)
        print(json.dumps({"loaded": loaded, "value": value, "fresh": fresh, "called": sorted(jit_cache._CALLED),
                          "misses": sum(answer.stats.cache_misses.values()), "gave": gave,
                          "llvm_kib": [before, after]}))
"""


def test_a_run_preloads_the_kernels_the_last_one_called_and_gives_the_compiler_back(tmp_path):
    """called_signatures lists the kernels called from Python, not those only other
    kernels call; a fresh process preloads them from the disk cache (a call then finds
    its code), and the compiler's pages go (most of libllvmlite.so's resident pages)
    and come back for a later compile."""
    package = tmp_path / "kernelpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "preloaded.py").write_text(textwrap.dedent(PRELOADED))
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *sys.path])
    listed = str(tmp_path / "kernels.pkl")

    def run(stage):
        return subprocess.run([sys.executable, "-m", "kernelpkg.preloaded", stage, listed], cwd=tmp_path,
                              env=env, capture_output=True, text=True, check=True).stdout.split("\n")
    first = run("first")
    assert first[0] == "7" and first[1] == "answer"
    second = json.loads(run("second")[0])
    assert (second["loaded"], second["value"], second["fresh"], second["misses"]) == (1, 7, 4, 0)
    assert second["called"] == [] and second["gave"]  # (the call found its code)
    before, after = second["llvm_kib"]
    assert before > 20_000 and after < before // 4

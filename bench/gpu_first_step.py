"""The first generation of a fresh process on the CUDA backend: seconds, and the
kernels numba loaded from its on-disk cache or compiled. Run twice on a GPU: the
second process should compile nothing (kernels/cuda/disk_cache.py).
Usage: python bench/gpu_first_step.py [MODEL_DIR]  (default: tests/models/stories260K)"""
import os
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)


def kernel_dispatchers():
    """Every cached kernel the CUDA backend's modules hold (in dicts and tuples too)."""
    import importlib
    import pkgutil

    import tinypaged.kernels.cuda as package
    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        todo = list(vars(module).values())
        while todo:
            value = todo.pop()
            if isinstance(value, dict):
                todo += value.values()
            elif isinstance(value, (tuple, list)):
                todo += value
            elif getattr(value, "_cache", None) is not None and hasattr(value, "stats"):
                found[id(value)] = value
    return list(found.values())


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "models", "stories260K")
    from numba import config
    if config.ENABLE_CUDASIM:  # a rehearsal: the simulator needs the tests' warp shim
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        import warp_shim
        warp_shim.install()
    start = time.perf_counter()
    from tinypaged import LLM, SamplingParams
    llm = LLM(model, backend="cuda", kv_cache_memory=64 << 20)
    out = llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=8,
                                                             ignore_eos=True))
    seconds = time.perf_counter() - start
    llm.close()  # (the engine thread stopped before the interpreter exits)
    hits = misses = 0
    for kernel in kernel_dispatchers():
        hits += sum(kernel.stats.cache_hits.values())
        misses += sum(kernel.stats.cache_misses.values())
    print(f"first generation: {seconds:.1f} s; kernels loaded from the disk cache: {hits}, "
          f"compiled: {misses}; text: {out[0].outputs[0].text!r}; numba's CPU threads: "
          f"{threading_layer()}", flush=True)


def threading_layer() -> str:
    """numba's threading layer where one started (TBB's keeps C++ threads a process's
    exit can meet unjoined: a suspect for the "terminate called" seen once at exit)."""
    import numba
    try:
        return numba.threading_layer()
    except ValueError:
        return "none started"


if __name__ == "__main__":
    main()

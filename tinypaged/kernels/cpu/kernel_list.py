"""The kernels a model ran with on the CPU, kept to be loaded before its weights are
read on the next run.

A run maps the model's prepared weights (weight_cache.py) and loads each kernel from
numba's disk cache at its first call: during the first step, as the weights' pages
come in, so the weights, the kernels and numba's compiler (LLVM, ~67 MB resident) all
peak together. Loaded from the list the last run left, before the weights are read,
the kernels are in place and the compiler's pages can be given back first
(jit_cache.give_back_compiler_pages): Gemma 3 270M's peak RSS 1.79x -> 1.57-1.60x its file
(bench/NOTES.md). The list is numba types pickled, as numba's own cache index keeps
them, in numba's cache folder (never beside a model: a model folder is not code one
runs), named by the model file's path, size and mtime; a run of that one model that
called kernels the list lacked writes it at exit. KEPT_LISTS bound the folder's lists.
"""
from __future__ import annotations

import atexit
import glob
import hashlib
import logging
import os
import pickle

from ...jit_cache import called_signatures, give_back_compiler_pages, preload
from .lanes_product import _gemm_range

KEPT_LISTS = 32  # lists in numba's cache folder; the oldest go first
log = logging.getLogger("tinypaged")
_recorded: set[str] = set()  # lists this process writes at exit


def load_kernels_for(source) -> int:
    """Loads the kernels the last run of the model file `source` used (none on a first
    run), then gives back the compiler's pages; the list is written at exit. Returns how
    many kernels were loaded."""
    path = _list_path(source)
    try:
        with open(path, "rb") as f:
            known = pickle.load(f)
    except Exception:  # (no list yet, or one another numba wrote: the run makes it anew)
        known = {}
    loaded = preload(known) if known else 0
    if loaded:
        give_back_compiler_pages()
    if path not in _recorded:
        _recorded.add(path)
        atexit.register(_save, path, known)
    return loaded


def _save(path: str, known: dict) -> None:
    """The list at `path`: the kernels loaded before (known) and called in this process;
    none where the process loaded other models too (what it called is not this one's)."""
    if len(_recorded) > 1:
        return
    merged = {key: list(dict.fromkeys(known.get(key, []) + sigs)) for key, sigs in called_signatures().items()}
    merged = {**known, **merged}
    if merged == known:
        return
    try:
        with open(path + ".tmp", "wb") as f:
            pickle.dump(merged, f)
        os.replace(path + ".tmp", path)
        for stale in sorted(glob.glob(os.path.join(os.path.dirname(path), "kernels-*.pkl")),
                            key=os.path.getmtime)[:-KEPT_LISTS]:
            os.remove(stale)
    except OSError as e:
        log.debug("kernel list %s not written: %s", path, e)


def _list_path(source) -> str:
    stat = os.stat(source)
    name = f"{os.path.abspath(source)}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return os.path.join(_gemm_range._cache._cache_path, f"kernels-{hashlib.sha256(name.encode()).hexdigest()[:24]}.pkl")

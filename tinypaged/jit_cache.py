"""`cached_njit`: numba.njit with an on-disk cache that goes stale when any source it
compiled in changes, not only the kernel's own file.

numba links every njit function and intrinsic a kernel calls into the kernel's
machine code, but checks a cached kernel against the kernel's own file alone. A change
to lanes_ir.py (say, a new weight layout) would leave lanes_product.py's cached code
running the old layout: wrong products with no error. Here the cache's stamp also
holds a digest of the modules of the same package that the kernel's file imports:
followed through every module that imports numba (the code that can be compiled in),
and the first module that does not (its constants can be) taken without its imports.
Imports are read from the sources, so those inside functions count too.
"""
from __future__ import annotations

import ast
import hashlib
import os
import sys
from functools import lru_cache

from numba import njit
from numba.core.caching import CompileResultCacheImpl, FunctionCache


def cached_njit(**options):
    """Decorator: `njit(**options)` cached on disk, stamped with its sources (above)."""
    def decorate(py_func):
        dispatcher = njit(**options)(py_func)
        dispatcher._cache = _SourcesCache(py_func)  # what njit(cache=True) sets, stamped
        return dispatcher
    return decorate


@lru_cache(maxsize=None)
def sources_digest(module_name: str) -> str:
    """sha256 over the sources of `module_name` and the package modules it imports."""
    digest = hashlib.sha256()
    for path in sorted(_closure(module_name)):
        with open(path, "rb") as f:
            digest.update(path.encode() + b"\0" + f.read())
    return digest.hexdigest()


class StampedLocator:
    """numba's locator for the function, with the sources' digest added to its stamp."""

    def __init__(self, locator, module_name: str):
        self._locator = locator
        self._module_name = module_name

    def get_source_stamp(self):
        return self._locator.get_source_stamp(), sources_digest(self._module_name)

    def __getattr__(self, name):
        return getattr(self._locator, name)


class _SourcesCacheImpl(CompileResultCacheImpl):
    def __init__(self, py_func):
        super().__init__(py_func)
        module = sys.modules[py_func.__module__]
        spec = getattr(module, "__spec__", None)  # `python -m a.b`: __main__ is a.b
        self._locator = StampedLocator(self._locator, spec.name if spec else module.__name__)


class _SourcesCache(FunctionCache):
    _impl_class = _SourcesCacheImpl


@lru_cache(maxsize=None)
def _closure(module_name: str) -> frozenset:
    """Source paths of `module_name` and of the modules of its top-level package that
    it imports, followed through the modules that import numba."""
    package = module_name.partition(".")[0]
    seen, paths, todo = set(), set(), [module_name]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _source_path(name)
        if path is None:
            continue
        paths.add(path)
        is_package = os.path.basename(path) == "__init__.py"
        imports = _imports(path, name, is_package)
        if "numba" in {m.partition(".")[0] for m in imports}:
            todo.extend(m for m in imports if m.partition(".")[0] == package)
    return frozenset(paths)


@lru_cache(maxsize=None)
def _imports(path: str, module_name: str, is_package: bool) -> tuple:
    """Absolute names of the modules a source file imports (for `from a import b`,
    both a and a.b, since b may be a module)."""
    with open(path, "rb") as f:
        tree = ast.parse(f.read(), path)
    here = module_name if is_package else module_name.rpartition(".")[0]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                base = f"{parent}.{base}" if base else parent
            names.append(base)
            names += [f"{base}.{alias.name}" for alias in node.names]
    return tuple(names)


def _source_path(module_name: str):
    """The file of a module of an imported package, found on disk without importing it
    (None for a name that is not a module: `b` in `from a import b`)."""
    top, _, rest = module_name.partition(".")
    package = sys.modules.get(top)
    if package is None or not getattr(package, "__file__", None):
        return None
    base = os.path.join(os.path.dirname(package.__file__), *rest.split(".")) if rest else \
        os.path.dirname(package.__file__)
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None

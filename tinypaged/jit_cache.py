"""`cached_njit`: numba.njit with an on-disk cache that goes stale when any source it
compiled in changes, not only the kernel's own file; the kernels a run called, to load
again before the next run's weights are read (preload), and numba's compiler's pages
given back once they are (give_back_compiler_pages).

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
import ctypes
import hashlib
import importlib
import logging
import os
import sys
from functools import lru_cache

from numba import njit
from numba.core.caching import CompileResultCacheImpl, FunctionCache

log = logging.getLogger("tinypaged")
MADV_DONTNEED, MADV_PAGEOUT = 4, 21  # Linux: drop these pages; (5.4+) reclaim them now


_KERNELS: dict = {}  # "module:qualname" -> each cached_njit dispatcher made
_CALLED: set = set()  # the keys of those called from Python (not only from other kernels)


def cached_njit(**options):
    """Decorator: `njit(**options)` cached on disk, stamped with its sources (above)."""
    def decorate(py_func):
        dispatcher = njit(**options)(py_func)
        dispatcher._cache = _SourcesCache(py_func)  # what njit(cache=True) sets, stamped
        key = _key(py_func)
        _KERNELS[key] = dispatcher
        compile_for_args = dispatcher._compile_for_args

        def called(*args, **kws):  # (numba's path for a call from Python it has no code for)
            _CALLED.add(key)
            return compile_for_args(*args, **kws)
        dispatcher._compile_for_args = called
        return dispatcher
    return decorate


def _key(py_func) -> str:
    return f"{py_func.__module__}:{py_func.__qualname__}"


def compile_as_called(kernel, arg_types) -> None:
    """A cached kernel compiled for arg_types (its code loaded from the disk cache where
    it is there) and listed as called from Python: for a kernel other code calls at its
    address (kernels/cpu/address_call.py), which preload must load too."""
    key = _key(kernel.py_func)
    kernel.compile(tuple(arg_types))
    if _KERNELS.get(key) is kernel:  # (a plain njit kernel has no disk cache to preload)
        _CALLED.add(key)


def called_signatures() -> dict:
    """{"module:qualname": [signature, ...]} of the cached kernels this process called
    from Python (numba types: picklable, as numba's own cache index keeps them). Not
    a kernel only other kernels call: its code is in theirs."""
    return {key: list(_KERNELS[key].signatures) for key in _CALLED}


def preload(signatures: dict) -> int:
    """Loads each kernel's signatures (called_signatures' form) from the disk cache
    (compiles those it lacks), as a first call would: returns how many. A kernel or
    signature this version does not have is skipped."""
    loaded = 0
    for key, sigs in signatures.items():
        module = key.partition(":")[0]
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        kernel = _KERNELS.get(key)
        for sig in sigs if kernel is not None else ():
            try:
                kernel.compile(sig)
                loaded += 1
            except Exception as e:  # (a signature that no longer types)
                log.debug("kernel %s%s not preloaded: %s", key, sig, e)
    return loaded


def give_back_compiler_pages() -> bool:
    """Drops this process's pages of numba's compiler (LLVM, libllvmlite.so: ~67 MB
    resident once kernels are loaded, none of it used to run them); a later compile
    faults back what it needs. A mapping none of whose pages was written is dropped
    outright (MADV_DONTNEED: its pages are the file's), one with written pages (its
    relocated data) only reclaimed (MADV_PAGEOUT keeps what it cannot write back, and
    leaves a page another process maps too). False where this cannot be asked (not
    Linux, a kernel before 5.4)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    done, span = True, None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # (a mapping's first line)
                named = len(fields) > 5 and os.path.basename(fields[5]).startswith("libllvmlite")
                span = tuple(int(x, 16) for x in fields[0].split("-")) if named else None
            elif span is not None and fields[0] == "Private_Dirty:":
                advice = MADV_DONTNEED if fields[1] == "0" else MADV_PAGEOUT
                done = libc.madvise(span[0], span[1] - span[0], advice) == 0 and done
                span = None
    if hasattr(libc, "malloc_trim"):  # (glibc's; musl has none)
        libc.malloc_trim(0)  # (and the heap the compiler freed, in every thread's arena)
    return done


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

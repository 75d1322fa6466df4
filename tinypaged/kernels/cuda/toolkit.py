"""The CUDA toolkit around the kernels: the packages installed, the versions this
backend was tested with, and where NVVM (the compiler numba-cuda drives) is.

numba-cuda finds libNVVM through cuda-pathfinder: a wheel (nvidia-nvvm), the
environment's CUDA_HOME/CUDA_PATH, or beside an NVRTC found by system search. A
machine with the toolkit in /usr/local/cuda but NVRTC from a wheel falls between
them: every kernel compile fails. `find_nvvm` looks where toolkits live and sets
CUDA_HOME before numba's first compile.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import warnings
from importlib import metadata

PACKAGES = ("numpy", "numba", "llvmlite", "numba-cuda", "cuda-core", "cuda-bindings",
            "cuda-pathfinder")
# (package, lowest tested, first untested): numba-cuda 0.30.2 is the first that takes
# cuda-core 1.x, whose GraphBuilder the recorded decode steps are captured with; numba-cuda
# 0.30.x does not compile with numpy 2.5 (check_numba_cuda_imports)
TESTED = (("numba-cuda", "0.30.2", "0.31"), ("cuda-core", "1.0", "2"), ("numpy", "1.26", "2.5"))


def installed_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _release(version: str) -> tuple[int, ...]:
    """'0.30.4' -> (0, 30, 4); what follows the numbers ('rc1', '.dev2') is dropped."""
    numbers = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(n) for n in numbers.group().split(".")) if numbers else ()


def untested(versions: dict[str, str | None]) -> list[str]:
    """One line for each package outside the window this backend was tested in."""
    lines = []
    for name, low, high in TESTED:
        have = versions.get(name)
        if have is None:
            lines.append(f"{name} is not installed (tested: >={low},<{high})")
        elif not _release(low) <= _release(have) < _release(high):
            lines.append(f"{name} {have} is outside the tested >={low},<{high}")
    return lines


def toolkit_roots() -> list[str]:
    """Where a CUDA toolkit may be: nvcc's, /usr/local/cuda, /usr/local/cuda-*, /opt/cuda."""
    roots = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    roots += ["/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True), "/opt/cuda"]
    return list(dict.fromkeys(roots))


def find_nvvm() -> tuple[str, str]:
    """(libnvvm's path, how it was found). Where cuda-pathfinder does not find it and
    neither CUDA_HOME nor CUDA_PATH is set, the first toolkit root holding
    nvvm/lib64/libnvvm.so becomes CUDA_HOME. Raises RuntimeError naming the places
    looked at when there is none."""
    from cuda.pathfinder import DynamicLibNotFoundError, load_nvidia_dynamic_lib
    try:
        lib = load_nvidia_dynamic_lib("nvvm")
        return lib.abs_path, lib.found_via
    except DynamicLibNotFoundError as e:
        first_error = e
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        raise RuntimeError(f"libnvvm not found, CUDA_HOME/CUDA_PATH set: {first_error}")
    roots = toolkit_roots()
    for root in roots:
        if glob.glob(os.path.join(root, "nvvm", "lib64", "libnvvm.so*")):
            os.environ["CUDA_HOME"] = root  # read by numba-cuda and pathfinder alike
            lib = load_nvidia_dynamic_lib("nvvm")
            return lib.abs_path, f"CUDA_HOME={root} (set here)"
    raise RuntimeError(f"libnvvm not found: no nvidia-nvvm wheel, no CUDA_HOME, and none "
                       f"of {', '.join(roots)} holds nvvm/lib64/libnvvm.so ({first_error})")


def check_numba_cuda_imports() -> None:
    """numba-cuda's typing of NumPy functions loads on the first compile; 0.30.4 names
    np.row_stack there, which numpy 2.5 removed, so every compile fails with an
    AttributeError far from its cause. Raises RuntimeError naming it instead."""
    try:
        import numba.cuda.np.arrayobj  # noqa: F401 - what the first compile imports
    except AttributeError as e:
        import numpy as np
        versions = installed_versions()
        raise RuntimeError(
            f"numba-cuda {versions['numba-cuda']} does not work with numpy {np.__version__} "
            f"({e}); install numpy<2.5 (the cuda extra pins it)") from e


_PREPARED = []


def prepare_compiler() -> None:
    """Once a process: find NVVM (above), and warn about package versions outside the
    tested window. Raises RuntimeError when no NVVM is there: no kernel could compile."""
    if _PREPARED:
        return
    find_nvvm()
    check_numba_cuda_imports()
    for line in untested(installed_versions()):
        warnings.warn(f"tinypaged's CUDA backend: {line}", RuntimeWarning, stacklevel=3)
    _PREPARED.append(True)

"""The CUDA backend: numba.cuda kernels and the device memory they work in.

Importing this package imports numba.cuda; `cuda_usable()` says whether a real
GPU is there (the CUDA simulator, NUMBA_ENABLE_CUDASIM=1, runs the kernels on the
CPU for tests but is not a backend to serve with).
"""


def cuda_usable() -> bool:
    from numba import config, cuda
    return bool(cuda.is_available()) and not config.ENABLE_CUDASIM


def cuda_simulated() -> bool:
    from numba import config
    return bool(config.ENABLE_CUDASIM)

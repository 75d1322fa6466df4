"""`device_function`: a CUDA device function compiled once per signature and inlined
by NVVM (forceinline), not by numba's IR inliner.

numba's inline="always" copies the callee's IR and runs its front end again at every
call site, nested callees included: two thirds of the sm_90 compile of the tiled
products went there (bench/NOTES.md). NVVM's inlining gives the same registers.
A few device functions stay inline="always", each saying why: one that returns an
array it did not take (numba allows that only inlined) and one whose local array
spills when NVVM inlines it. The simulator's jit takes no forceinline.
"""
from numba import config, cuda


def device_function(py_func):
    """Decorator: cuda.jit(device=True, forceinline=True) (plain device=True on the
    simulator, which runs it as Python)."""
    if config.ENABLE_CUDASIM:
        return cuda.jit(device=True)(py_func)
    return cuda.jit(device=True, forceinline=True)(py_func)

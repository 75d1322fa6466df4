"""cuda.jit with launch bounds: ptxas budgets a kernel's registers by them."""
from .disk_cache import cached_kernel


def jit_bounded(launch_bounds):
    """A cached kernel with launch_bounds=(max threads a block, min blocks an SM). On
    an H100/H200, 65,536 registers over max threads x min blocks caps registers a
    thread. (The simulator's jit takes no bounds, and has no registers to budget.)"""
    return cached_kernel(launch_bounds)

"""cuda.jit with launch bounds: ptxas budgets a kernel's registers by them."""
from numba import config, cuda


def jit_bounded(launch_bounds):
    """cuda.jit(launch_bounds=...): (max threads a block, min blocks an SM). On an
    H100/H200, 65,536 registers over max threads x min blocks caps registers a thread.
    The simulator's jit takes no bounds, and has no registers to budget."""
    return cuda.jit if config.ENABLE_CUDASIM else cuda.jit(launch_bounds=launch_bounds)

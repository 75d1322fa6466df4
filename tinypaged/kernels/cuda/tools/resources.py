"""What each CUDA kernel costs an SM, read without a GPU: registers, stack frame,
spills and shared memory from ptxas (through nvJitLink, sm_90 SASS), and the
theoretical occupancy they allow on an H100 / H200.

`python -m tinypaged.kernels.cuda.tools.ptx --resources` prints the table. A stack frame
is a local-memory array (slow, off-chip); occupancy is the share of the SM's 64
warp slots the kernel's blocks can fill at once, the first of its limits:

    registers   65,536 per SM, allocated per warp in units of 256
    shared      228 KiB per SM, of which 1 KiB is reserved per resident block
    threads     2,048 per SM; blocks 32 per SM

Needs the `cuda` extra (nvJitLink) and runs without NUMBA_ENABLE_CUDASIM.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..warp import WARP

REGISTERS_PER_SM = 65536
REGISTER_UNIT = 256  # registers are given to a warp in these units
SHARED_PER_SM = 228 * 1024
SHARED_RESERVED_PER_BLOCK = 1024
WARPS_PER_SM = 64
BLOCKS_PER_SM = 32


@dataclass(frozen=True, slots=True)
class KernelResources:
    label: str
    threads: int  # per block, as the backend launches it
    registers: int  # per thread
    stack_bytes: int
    spill_bytes: int  # stores + loads
    shared_bytes: int  # static shared memory per block

    @property
    def occupancy(self) -> float:
        """Resident warps / 64 at the first limit (module docstring)."""
        warps = math.ceil(self.threads / WARP)
        per_warp = math.ceil(self.registers * WARP / REGISTER_UNIT) * REGISTER_UNIT
        by_registers = (REGISTERS_PER_SM // per_warp) // warps if per_warp else BLOCKS_PER_SM
        by_shared = (SHARED_PER_SM // (self.shared_bytes + SHARED_RESERVED_PER_BLOCK)
                     if self.shared_bytes else BLOCKS_PER_SM)
        blocks = min(by_registers, by_shared, WARPS_PER_SM // warps, BLOCKS_PER_SM)
        return blocks * warps / WARPS_PER_SM


def shared_bytes(ptx: str) -> int:
    """Static shared memory declared in a kernel's PTX (`.shared ... name[bytes]`)."""
    return sum(int(n) * _width(t) for t, n in
               re.findall(r"\.shared\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+[\w$]+\[(\d+)\]", ptx))


def _width(ptx_type: str) -> int:
    return int(re.sub(r"\D", "", ptx_type) or 8) // 8


def link(ptx: str, arch: str = "sm_90") -> tuple[str, bytes]:
    """(ptxas's verbose report, the cubin) of the PTX's kernel compiled to `arch` SASS
    by nvJitLink."""
    from cuda.bindings import nvjitlink

    options = [f"-arch={arch}", "-verbose"]
    handle = nvjitlink.create(len(options), options)
    try:
        data = ptx.encode()
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel")
        nvjitlink.complete(handle)
        log = bytearray(nvjitlink.get_info_log_size(handle))
        nvjitlink.get_info_log(handle, log)
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
    finally:
        nvjitlink.destroy(handle)
    return log.decode(errors="replace"), bytes(cubin)


def ptxas_report(ptx: str, arch: str = "sm_90") -> tuple[int, int, int]:
    """(registers, stack frame bytes, spill bytes) ptxas reports for the PTX's one
    kernel, compiled to `arch` SASS by nvJitLink."""
    text = link(ptx, arch)[0]
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text)
    used = re.search(r"Used (\d+) registers", text)
    if not (frame and used):
        raise RuntimeError(f"no resource line in ptxas's report:\n{text[-2000:]}")
    stack, stores, loads = (int(g) for g in frame.groups())
    return int(used.group(1)), stack, stores + loads


def measure(label: str, ptx: str, threads: int) -> KernelResources:
    registers, stack, spills = ptxas_report(ptx)
    return KernelResources(label, threads, registers, stack, spills, shared_bytes(ptx))


def table(rows: list[KernelResources]) -> str:
    lines = [f"{'kernel':32} {'threads':>7} {'regs':>5} {'stack B':>7} {'spill B':>7} "
             f"{'smem B':>7} {'occupancy':>9}"]
    for r in rows:
        lines.append(f"{r.label:32} {r.threads:7} {r.registers:5} {r.stack_bytes:7} "
                     f"{r.spill_bytes:7} {r.shared_bytes:7} {r.occupancy:9.0%}")
    return "\n".join(lines)

"""A kernel's sm_90 machine code (SASS) and the global loads its threads wait on, read
without a GPU: the kernel compiled to PTX as the audit does (kernels/cuda/tools/ptx.py's
signatures), linked to a cubin by nvJitLink (resources.link), disassembled by nvdisasm.

    python bench/sass.py LABEL [LABEL ...] [--listing]

prints, per kernel and per loop body in it, its global loads (LDG) and its waits:
instructions that read a register an outstanding load writes (each a round trip the
thread sits out; every load then in flight is taken as arrived with it). The listing
is read as straight-line text, every branch's code once and every predicated
instruction as executed, so the count is of the code, not of one thread's path:
compare kernels and versions, do not read it as a path's round trips. A step whose
loads all go out before the first use waits once (matmul.gemv_one_row); row_dots'
FLOAT_VEC loop over up to 8 rows of x waits on each weight in turn.

Needs the `cuda` extra and nvdisasm: `pip install nvidia-cuda-nvdisasm` (the
CUDA 13 wheel; no GPU), or nvdisasm on PATH.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)\s*([^;]*);")


def nvdisasm() -> str:
    """The nvdisasm binary: on PATH, or in the nvidia-cuda-nvdisasm wheel."""
    import nvidia  # (the namespace the CUDA wheels install into)
    found = shutil.which("nvdisasm") or next(
        iter(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "bin", "nvdisasm"))), None)
    if found is None:
        raise SystemExit("nvdisasm not found: pip install nvidia-cuda-nvdisasm")
    return found


def listing(label: str) -> str:
    """The SASS of the audit's kernel `label` (e.g. "gemv_rows[f16]")."""
    import tempfile

    from tinypaged.kernels.cuda.tools import ptx
    from tinypaged.kernels.cuda.tools.resources import link
    for name, kernel, args in ptx.signatures():
        if name == label:
            code = ptx.compile_kernel(kernel, args)
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(link(code)[1])
                f.flush()
                return subprocess.run([nvdisasm(), "-c", f.name], check=True, capture_output=True,
                                      text=True).stdout
    raise SystemExit(f"no kernel {label!r}: the labels are python -m tinypaged.kernels.cuda.tools.ptx's")


def _registers(operand: str) -> set[int]:
    """Registers an operand names: R4, R4.64 (R4, R5), [R4.64+0x8] (R4, R5)."""
    regs = set()
    for number, wide in re.findall(r"\bR(\d+)(\.64)?", operand):
        regs |= {int(number), int(number) + 1} if wide else {int(number)}
    return regs


def load_waits(sass: str) -> tuple[int, int]:
    """(global loads, waits on them) of a listing, read as the module docstring says."""
    pending: list[set[int]] = []  # each outstanding load's destination registers
    loads = waits = 0
    for opcode, operands in INSTRUCTION.findall(sass):
        parts = [p.strip() for p in operands.split(",")] if operands.strip() else []
        stores = opcode.startswith(("ST", "RED", "ATOM"))
        read = set().union(*(_registers(p) for p in (parts if stores else parts[1:])))
        if any(regs & read for regs in pending):
            waits += 1
            pending = []  # (what was in flight arrives within the same round trip)
        written = _registers(parts[0]) if parts and not stores else set()
        if opcode.startswith("LDG"):
            first = min(written) if written else 0
            width = 4 if ".128" in opcode else 2 if ".64" in opcode else 1
            pending.append(set(range(first, first + width)))
            loads += 1
        elif written:  # (a register written by another instruction no longer waits on a load)
            pending = [regs - written for regs in pending if regs - written]
    return loads, waits


def loops(sass: str) -> list[tuple[str, str, int, int]]:
    """(first address, last address, global loads, waits) of each loop body with loads:
    the code from a label back to which a later branch jumps, shortest first (ptxas'
    out-of-line paths, such as a shuffle's divergent fallback, can show up as loops)."""
    lines = sass.splitlines()
    labels, bodies = {}, []
    for i, line in enumerate(lines):
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = i
        jump = re.search(r"BRA\s+`\((\.L_x_\d+)\)", line)
        if jump and jump.group(1) in labels:  # (a label already seen: a backward branch)
            bodies.append((labels[jump.group(1)], i))
    rows = []
    for start, end in sorted(set(bodies), key=lambda b: b[1] - b[0]):
        text = "\n".join(lines[start:end + 1])
        addresses = re.findall(r"/\*([0-9a-f]{4,})\*/", text)
        loads, waits = load_waits(text)
        if loads:  # (loops of shuffles or barriers alone left out)
            rows.append((addresses[0], addresses[-1], loads, waits))
    return rows


def main(argv: list[str]) -> None:
    labels = [a for a in argv if not a.startswith("--")]
    for label in labels:
        sass = listing(label)
        if "--listing" in argv:
            print(sass)
        loads, waits = load_waits(sass)
        print(f"{label}: {loads} global loads, {waits} waits on them")
        for first, last, loads, waits in loops(sass):
            print(f"  loop {first}-{last}: {loads} global loads, {waits} waits")


if __name__ == "__main__":
    main(sys.argv[1:])

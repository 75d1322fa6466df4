"""The CPU backend's prepared weights, kept in a file beside the model file and mapped
on the next load.

Preparing a GGUF's weights (packed.py splits the blocks, stacks.py stacks each layer's
matrices, lanes.py lays them out 16 rows to a group) takes seconds a GB; mapping
the result takes milliseconds. The file holds every array of the prepared forms,
page-aligned, after a JSON header that names the forms (array, LinearWeight,
LanePacked, and views of a stack's rows) and the key it was made under:
the model file's size and mtime, LAYOUT_VERSION, which byte dot the lanes layout
was made for (the high bits' form depends on the CPU), and a digest of the sources
that make the forms. Any other key, or a file that
does not read whole, is a miss, and the next save replaces it.

Mapped copy-on-write: the kernels see ordinary writable arrays, the pages stay the
file's (shared with the page cache, never copied unless written), so the weights
are resident once.
"""
from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import struct
from functools import lru_cache
from pathlib import Path

import numpy as np

from ...formats.quant_kind import KINDS
from .byte_dot import LANES_ISA
from .kernel_list import load_kernels_for
from .lane_packed import LANE_ARRAYS, LanePacked
from .linear import LinearWeight
from .stack_rows import StackRows
from .stacks import stack_view

LAYOUT_VERSION = 4  # the file's own format (its header and forms); the arrays' meaning: FORM_SOURCES
# what makes the prepared forms (tinypaged/...): their digest is part of the key
FORM_SOURCES = ("formats/packed.py", "formats/kquant.py", "kernels/cpu/linear.py", "kernels/cpu/stacks.py",
                "kernels/cpu/stack_rows.py", "kernels/cpu/lanes.py", "kernels/cpu/lane_packed.py")
MAGIC = b"tinypaged-weights\n"
SUFFIX = ".tinypaged-cpu"
ALIGN = 4096  # each array starts on a page
SAMPLES = 64  # pages of the model file the key's digest reads
log = logging.getLogger("tinypaged")


def load_prepared_weights(source) -> dict | None:
    """The backend's op (reference.load_prepared_weights): a GGUF file's prepared
    weights from the file beside it, when it matches the GGUF as it is now; the
    kernels its last run used loaded first (kernel_list.py)."""
    if not _cacheable(source):
        return None
    load_kernels_for(source)
    return load(source)


def save_prepared_weights(source, weights: dict) -> None:
    """The backend's op: a GGUF file's prepared weights kept beside it; where that
    folder cannot be written, the next load prepares them again (logged)."""
    if not _cacheable(source):
        return
    try:
        save(source, weights)
    except OSError as e:
        log.warning("prepared weights not kept beside %s (%s): the next load prepares them again",
                    source, e)


def _cacheable(source) -> bool:
    return os.fspath(source).lower().endswith(".gguf") and os.path.isfile(source)


def cache_path(source: str | os.PathLike) -> Path:
    return Path(os.fspath(source) + SUFFIX)


def _key(source: str | os.PathLike) -> dict:
    """What the prepared weights depend on: the file (its size, mtime and a digest of
    its header and of 64 pages spread over it: a file rewritten within the clock's
    tick keeps its mtime), this layout, and whether this CPU lays matrices out."""
    st = os.stat(source)
    digest = hashlib.blake2b(digest_size=16)
    with open(source, "rb") as f:
        digest.update(f.read(1 << 16))
        for i in range(SAMPLES):
            f.seek(st.st_size * i // SAMPLES)
            digest.update(f.read(ALIGN))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "digest": digest.hexdigest(),
            "version": LAYOUT_VERSION, "lanes": LANES_ISA, "sources": _form_sources_digest()}


@lru_cache(maxsize=None)
def _form_sources_digest() -> str:
    """A digest of the sources that make the prepared forms (FORM_SOURCES): a change to
    how matrices are split, stacked or laid out makes older files misses, with no
    version to remember to raise."""
    digest = hashlib.blake2b(digest_size=16)
    package = Path(__file__).resolve().parents[2]
    for relative in FORM_SOURCES:
        digest.update((package / relative).read_bytes())
    return digest.hexdigest()


class _Writer:
    """The forms as manifest entries; their arrays listed in file order."""

    def __init__(self):
        self.entries, self.index, self.arrays, self.offset = [], {}, [], 0

    def array(self, a):
        if a is None:
            return None
        a = np.ascontiguousarray(a)
        self.offset = -(-self.offset // ALIGN) * ALIGN
        spec = {"offset": self.offset, "dtype": a.dtype.str, "shape": list(a.shape)}
        self.arrays.append((self.offset, a))
        self.offset += a.nbytes
        return spec

    def form(self, w) -> int:
        if id(w) in self.index:
            return self.index[id(w)]
        if isinstance(w, StackRows):
            whole, start, stop = w.stack
            entry = {"form": "rows", "of": self.form(whole), "start": start, "stop": stop}
        elif isinstance(w, LanePacked):
            entry = {"form": "lanes", "kind": w.kind.code, "shape": list(w.shape),
                     "arrays": {n: self.array(getattr(w, n)) for n in LANE_ARRAYS}}
        elif isinstance(w, LinearWeight):
            entry = {"form": "linear", "kind": w.kind.code, "array": self.array(w.data)}
        elif isinstance(w, np.ndarray):
            entry = {"form": "array", "array": self.array(w)}
        else:
            raise TypeError(f"cannot cache a {type(w).__name__}")
        self.entries.append(entry)
        self.index[id(w)] = len(self.entries) - 1
        return self.index[id(w)]


def save(source: str | os.PathLike, weights: dict) -> Path:
    """Write the prepared weights of the model file `source` beside it (through a
    temporary file, renamed: a reader never sees half a file). OSError if the folder
    cannot be written."""
    writer = _Writer()
    names = {name: writer.form(w) for name, w in weights.items()}
    header = json.dumps({"key": _key(source), "entries": writer.entries, "names": names}).encode()
    start = -(-(len(MAGIC) + 8 + len(header)) // ALIGN) * ALIGN  # data after the header's page
    target = cache_path(source)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        with open(partial, "wb") as f:
            f.write(MAGIC + struct.pack("<Q", len(header)) + header)
            for offset, a in writer.arrays:
                f.seek(start + offset)
                f.write(memoryview(a.reshape(-1).view(np.uint8)))
            f.truncate(start + writer.offset)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def load(source: str | os.PathLike) -> dict | None:
    """The prepared weights saved for `source`, mapped; None when there are none for
    this file as it is now (another size or mtime, another layout)."""
    path = cache_path(source)
    try:
        with open(path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                return None
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
            if header.get("key") != _key(source):
                return None
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError, struct.error):
        return None
    start = -(-(len(MAGIC) + 8 + length) // ALIGN) * ALIGN
    try:
        forms = _rebuild(header["entries"], mapped, start)
        return {name: forms[i] for name, i in header["names"].items()}
    except (KeyError, ValueError, TypeError, IndexError):  # a damaged file: build anew
        return None


def _rebuild(entries: list, mapped: mmap.mmap, start: int) -> list:
    def array(spec):
        if spec is None:
            return None
        dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
        count = int(np.prod(shape))
        return np.frombuffer(mapped, dtype, count, start + spec["offset"]).reshape(shape)

    forms = []
    for e in entries:
        form = e["form"]
        if form == "rows":
            whole, begin, end = forms[e["of"]], e["start"], e["stop"]
            w = StackRows(whole, begin, end,
                          None if isinstance(whole, LanePacked) else stack_view(whole, begin, end))
        elif form == "lanes":
            w = LanePacked(KINDS[e["kind"]], tuple(e["shape"]),
                           **{n: array(spec) for n, spec in e["arrays"].items()})
        elif form == "linear":
            w = LinearWeight.of(KINDS[e["kind"]], array(e["array"]))
        elif form == "array":
            w = array(e["array"])
        else:
            raise ValueError(f"unknown form {form!r}")
        forms.append(w)
    return forms

"""GGUF reader in plain NumPy: header, metadata, tensor infos, tensor data.

Layout (little-endian, version 2 or 3):
    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x (string key, u32 value_type, value)
    n_tensors x (string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset)
    padding to `general.alignment` (default 32) | tensor data (offsets relative to here)
A string is a u64 length followed by UTF-8 bytes. GGUF lists dims fastest-first,
so a NumPy shape is the reversed dims.
"""
from __future__ import annotations

import mmap
import os
import struct
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .quant_kind import BLOCK_LAYOUT, tensor_nbytes

from .ggml_quant import dequantize

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# metadata value types -> struct format of a scalar (8 = string, 9 = array)
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i",
                   6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# numpy dtypes for fast reading of numeric arrays (vocab scores, token types)
_ARRAY_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4",
                 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}


@dataclass(slots=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # NumPy order (GGUF dims reversed)
    ggml_type: int
    offset: int  # absolute byte offset in the file
    nbytes: int


def _smallest_item(item_type: int) -> int:
    """Bytes one metadata array item of this type takes at least."""
    if item_type in _ARRAY_DTYPES:
        return np.dtype(_ARRAY_DTYPES[item_type]).itemsize
    if item_type == _STRING:
        return 8  # its length
    return struct.calcsize(_SCALAR_FORMATS[item_type]) if item_type in _SCALAR_FORMATS else 1


class _Cursor:
    """Bounds-checked little-endian reads over a memory-mapped file."""

    def __init__(self, buf: np.ndarray, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError(f"{self.path}: truncated GGUF file (needs byte {self.pos + n}, "
                             f"file has {len(self.buf)})")
        out = memoryview(self.buf[self.pos:self.pos + n])
        self.pos += n
        return out

    def scalar(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        try:
            return bytes(self.take(n)).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{self.path}: corrupt GGUF string at byte {self.pos - n}") from e

    def strings(self, count: int) -> list[str]:
        """count strings in a row (a vocabulary, its merges): string() without its
        per-call overhead, ~0.5 us a string where that took ~5."""
        data, pos, end, out = self.buf.data, self.pos, len(self.buf), []
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > end:
                self.take(end + 1 - self.pos)  # raises: truncated
            (n,) = unpack(data, pos)
            pos += 8
            if pos + n > end:
                self.pos = pos
                self.take(n)  # raises: truncated
            try:
                out.append(str(data[pos:pos + n], "utf-8"))
            except UnicodeDecodeError as e:
                raise ValueError(f"{self.path}: corrupt GGUF string at byte {pos}") from e
            pos += n
        self.pos = pos
        return out

    def value(self, vtype: int):
        if vtype in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type, count = self.scalar("<I"), self.scalar("<Q")
            if item_type == _ARRAY:  # unused by any model; and a lying file could nest deep
                raise ValueError(f"{self.path}: GGUF metadata array of arrays at byte "
                                 f"{self.pos} is not supported")
            if count * _smallest_item(item_type) > len(self.buf) - self.pos:  # before reading any
                raise ValueError(f"{self.path}: corrupt GGUF metadata: an array of {count} "
                                 f"items at byte {self.pos}, more than the file could hold")
            if item_type in _ARRAY_DTYPES:
                dtype = np.dtype(_ARRAY_DTYPES[item_type])
                return np.frombuffer(self.take(count * dtype.itemsize), dtype=dtype).copy()
            if item_type == _STRING:
                return self.strings(count)
            return [self.value(item_type) for _ in range(count)]
        raise ValueError(f"{self.path}: corrupt GGUF metadata: unknown value type {vtype} "
                         f"at byte {self.pos}")


_held = {"depth": 0, "parses": {}}  # parses_held(): open blocks, and (path, size, mtime) -> parse
_held_lock = threading.Lock()


@contextmanager
def parses_held():
    """Within the block (on any thread), GGUFFile.open parses each file once: a model's
    load reads the header for its tokenizer, its config and its tensor table, three
    parses of a 49k-token vocabulary otherwise. At the end of the outermost block the
    parses, and their files' mappings, are let go."""
    with _held_lock:
        _held["depth"] += 1
    try:
        yield
    finally:
        with _held_lock:
            _held["depth"] -= 1
            if not _held["depth"]:
                _held["parses"].clear()


class GGUFFile:
    """A parsed GGUF file: `metadata` (dict) and `tensors` (name -> GGUFTensorInfo)."""

    @classmethod
    def open(cls, path: str | os.PathLike) -> "GGUFFile":
        """The file's parse held by parses_held() (made on first use), else a new one."""
        try:
            stat = os.stat(path)
        except OSError:
            return cls(path)  # (which names the problem)
        key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
        with _held_lock:  # (a second thread asking for the same file waits for the parse)
            if not _held["depth"]:
                return cls(path)
            if key not in _held["parses"]:
                _held["parses"][key] = cls(path)
            return _held["parses"][key]

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"GGUF file not found: {self.path}")
        if os.path.getsize(self.path) < 24:  # magic, version and the two counts
            raise ValueError(f"{self.path}: truncated GGUF file ({os.path.getsize(self.path)} "
                             f"bytes; its header alone takes 24)")
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._buf = np.frombuffer(self._map, dtype=np.uint8)
        cur = _Cursor(self._buf, self.path)
        if bytes(cur.take(4)) != GGUF_MAGIC:
            raise ValueError(f"{self.path}: not a GGUF file (bad magic)")
        self.version = cur.scalar("<I")
        if self.version not in (2, 3):
            raise ValueError(f"{self.path}: GGUF version {self.version} is not supported (2 or 3)")
        n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
        # (each key takes 13 bytes at least, each tensor's info 24: the counts are checked
        # against the file's size before anything is read for them)
        if n_tensors * 24 + n_kv * 13 > len(self._buf) - cur.pos:
            raise ValueError(f"{self.path}: truncated GGUF file, or a corrupt header: "
                             f"{n_tensors} tensors and {n_kv} keys need more than its "
                             f"{len(self._buf)} bytes")
        self.metadata: dict = {}
        for _ in range(n_kv):
            key = cur.string()
            if key in self.metadata:
                raise ValueError(f"{self.path}: corrupt GGUF header: metadata key {key!r:.80} "
                                 f"appears twice")
            self.metadata[key] = cur.value(cur.scalar("<I"))
        raw_infos = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.scalar("<I")
            if n_dims > 8:
                raise ValueError(f"{self.path}: corrupt tensor info for {name!r} ({n_dims} dims)")
            dims = [cur.scalar("<Q") for _ in range(n_dims)]
            raw_infos.append((name, tuple(reversed(dims)), cur.scalar("<I"), cur.scalar("<Q")))
        alignment = self.integer("general.alignment", DEFAULT_ALIGNMENT)
        if not 0 < alignment <= 1 << 20:
            raise ValueError(f"{self.path}: corrupt GGUF header (general.alignment={alignment})")
        data_start = -(-cur.pos // alignment) * alignment
        self.tensors: dict[str, GGUFTensorInfo] = {}
        expected = 0  # where the tensor's data must start: the ones before it, each aligned
        for name, shape, ggml_type, rel_offset in raw_infos:
            if name in self.tensors:
                raise ValueError(f"{self.path}: corrupt GGUF header: tensor {name!r:.80} "
                                 f"appears twice")
            nbytes = self._checked(lambda: tensor_nbytes(ggml_type, shape, name))
            if expected is not None and rel_offset != expected:  # (as llama.cpp checks: a
                raise ValueError(  # lying type or shape shows here)
                    f"{self.path}: tensor {name!r} starts at data offset {rel_offset}, but the "
                    f"tensors before it end at {expected}: the header's type or shape of it or "
                    f"of one before it is wrong")
            # after a type we cannot size (refused by name if it is loaded), no more checks
            expected = -(-(rel_offset + nbytes) // alignment) * alignment \
                if expected is not None and ggml_type in BLOCK_LAYOUT else None
            info = GGUFTensorInfo(name, shape, ggml_type, data_start + rel_offset, nbytes)
            if info.offset + nbytes > len(self._buf):
                raise ValueError(f"{self.path}: truncated GGUF file: tensor {name!r} needs bytes "
                                 f"{info.offset}..{info.offset + nbytes}, file has {len(self._buf)}")
            self.tensors[name] = info

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def integer(self, key: str, default: int | None = None) -> int:
        """Metadata `key` as an int (required when no default): a ValueError naming it
        when it is missing or not an integer."""
        value = self.require(key) if default is None else self.metadata.get(key, default)
        if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{self.path}: GGUF metadata {key} must be an integer, got {value!r:.60}")
        return int(value)

    def number(self, key: str, default: float) -> float:
        value = self.metadata.get(key, default)
        if not isinstance(value, (int, float, np.number)) or not np.isfinite(value):
            raise ValueError(f"{self.path}: GGUF metadata {key} must be a finite number, "
                             f"got {value!r:.60}")
        return float(value)

    def require(self, key: str):
        if key not in self.metadata:
            raise ValueError(f"{self.path}: GGUF metadata key {key!r} is missing")
        return self.metadata[key]

    def raw(self, name: str) -> np.ndarray:
        """Tensor `name`'s bytes as stored (a uint8 view of the memory-mapped file)."""
        if name not in self.tensors:
            raise ValueError(f"{self.path}: tensor {name!r} is missing")
        info = self.tensors[name]
        return self._buf[info.offset:info.offset + info.nbytes]

    def release(self, name: str, start: int = 0, length: int | None = None) -> None:
        """Drop tensor `name`'s file pages (bytes start .. start + length of it, all by
        default) from this process's resident memory, once a copy of them is made (they
        come back from the page cache if read again): a model loaded from the file then
        holds its weights once, not twice."""
        info = self.tensors[name]
        length = info.nbytes - start if length is None else length
        begin = info.offset + start
        aligned = begin - begin % mmap.PAGESIZE
        if length > 0:
            self._map.madvise(mmap.MADV_DONTNEED, aligned, begin + length - aligned)

    def load(self, name: str) -> np.ndarray:
        """Tensor `name` dequantised to float32, in NumPy shape order."""
        if name not in self.tensors:
            raise ValueError(f"{self.path}: tensor {name!r} is missing")
        info = self.tensors[name]
        raw = self._buf[info.offset:info.offset + info.nbytes]
        return self._checked(lambda: dequantize(raw, info.ggml_type, info.shape, name))

    def _checked(self, work):
        """work(), its ValueError (about one tensor) prefixed with this file's path."""
        try:
            return work()
        except ValueError as e:
            raise ValueError(f"{self.path}: {e}") from None


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: per head, rows [r0, r1, r0', r1', ...]
    (interleaved pairs) back to [first halves..., second halves...] (rotate-half)."""
    rows = w.shape[0]
    return (w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])
             .swapaxes(1, 2).reshape(w.shape))

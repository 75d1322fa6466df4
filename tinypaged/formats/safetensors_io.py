"""Reading .safetensors files (single or sharded) into NumPy arrays.

The format is an u64 header length, a JSON header {name: {dtype, shape,
data_offsets: [begin, end]}} and the raw little-endian data. We parse it here
rather than through `safetensors.numpy` because NumPy has no bfloat16: BF16 is
widened by placing its 16 bits in the top half of a float32.
"""
from __future__ import annotations

import json
import math
import mmap
import os
import struct

import numpy as np

_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
MAX_HEADER_BYTES = 100 * 1024 * 1024


def _read_header(path: str, buf: np.ndarray) -> tuple[dict, int]:
    if len(buf) < 8:
        raise ValueError(f"{path}: truncated safetensors file ({len(buf)} bytes)")
    (n,) = struct.unpack("<Q", bytes(buf[:8]))
    if n > MAX_HEADER_BYTES or 8 + n > len(buf):
        raise ValueError(f"{path}: corrupt or truncated safetensors header "
                         f"(header says {n} bytes, file has {len(buf)})")
    try:
        header = json.loads(bytes(buf[8:8 + n]))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: corrupt safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: corrupt safetensors header (not a JSON object)")
    header.pop("__metadata__", None)
    return header, 8 + n


def _entries(path: str, header: dict, data_bytes: int) -> dict[str, tuple[str, tuple, int, int]]:
    """Each tensor's (dtype, shape, begin, end), the header checked as the safetensors
    library checks it: integer shapes and offsets, each range its shape's size, the
    ranges one after another from 0 with no gap or overlap, ending where the data does."""
    entries = {}
    for name, info in header.items():
        try:
            dtype_name, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError):
            raise ValueError(f"{path}: corrupt header entry for tensor {name!r}") from None
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"{path}: tensor {name!r}: shape {str(shape)[:80]} must be a list of "
                             f"non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(type(o) is int and o >= 0 for o in offsets) and offsets[0] <= offsets[1]):
            raise ValueError(f"{path}: tensor {name!r}: data_offsets {str(offsets)[:80]} must be two "
                             f"integers, begin <= end")
        if dtype_name not in _DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has dtype {str(dtype_name)[:20]}, "
                             f"supported: {', '.join(_DTYPES)}")
        begin, end = offsets
        if end - begin != math.prod(shape) * _DTYPES[dtype_name].itemsize:  # (exact: Python ints)
            raise ValueError(f"{path}: tensor {name!r}: byte range {begin}..{end} does not match "
                             f"shape {shape} of {dtype_name}")
        entries[name] = (dtype_name, tuple(shape), begin, end)
    at = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda entry: entry[1][2:]):
        if begin != at:
            raise ValueError(f"{path}: tensor {name!r} starts at byte {begin} of the data, not at "
                             f"{at} ({'a gap' if begin > at else 'overlapping the tensor before it'})")
        at = end
    if at > data_bytes:
        raise ValueError(f"{path}: truncated safetensors file: the tensors end at byte {at} of "
                         f"the data, which holds {data_bytes}")
    if at < data_bytes:
        raise ValueError(f"{path}: the tensors end at byte {at} of the data, which holds {data_bytes} "
                         f"(bytes nothing describes)")
    return entries


def read_safetensors(path: str | os.PathLike, names: set[str] | None = None) -> dict[str, np.ndarray]:
    """Tensors of one file (only `names` if given), widened to float32, except F16
    matrices (two or more dimensions), which stay float16: the CPU backend holds
    them as they are, and a float32 copy of every matrix would double the peak
    memory of loading (SmolLM2's float16 folder: 1036 -> 650 MiB peak RSS)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"weights file not found: {path}")
    mapped = None
    if os.path.getsize(path):
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    buf = np.frombuffer(mapped, dtype=np.uint8) if mapped is not None else np.zeros(0, np.uint8)
    header, data_start = _read_header(path, buf)
    out = {}
    for name, (dtype_name, shape, begin, end) in _entries(path, header, len(buf) - data_start).items():
        if names is not None and name not in names:
            continue
        dtype = _DTYPES[dtype_name]
        raw = buf[data_start + begin:data_start + end].view(dtype).reshape(shape)
        if dtype_name == "BF16":
            out[name] = (raw.astype(np.uint32) << 16).view(np.float32)
        elif dtype_name == "F16" and raw.ndim >= 2:
            out[name] = raw.copy()  # float16 (a copy: the memmap can be closed)
        else:
            out[name] = raw.astype(np.float32)  # a copy: the memmap can be closed
        if end > begin:  # copied: drop its file pages from our resident memory
            first = (data_start + begin) - (data_start + begin) % mmap.PAGESIZE
            mapped.madvise(mmap.MADV_DONTNEED, first, data_start + end - first)
    return out


def read_model_tensors(model_dir: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of a HF model folder: `model.safetensors` or a sharded index."""
    model_dir = os.fspath(model_dir)
    single = os.path.join(model_dir, "model.safetensors")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(single):
        return read_safetensors(single)
    if not os.path.isfile(index):
        raise FileNotFoundError(f"{model_dir}: no model.safetensors or "
                                f"model.safetensors.index.json")
    try:
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{index}: corrupt index ({e!r})") from None
    shards: dict[str, set[str]] = {}
    for name, shard in weight_map.items():
        shards.setdefault(shard, set()).add(name)
    out = {}
    for shard, names in sorted(shards.items()):
        tensors = read_safetensors(os.path.join(model_dir, shard), names)
        missing = names - tensors.keys()
        if missing:
            raise ValueError(f"{shard}: tensor {sorted(missing)[0]!r} listed in the index "
                             f"is not in the shard")
        out.update(tensors)
    return out

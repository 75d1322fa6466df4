"""Backends: modules exposing the same ops (see reference.py, their executable spec)."""
from __future__ import annotations

OP_NAMES = ("prepare_weights", "allocate_kv", "prepare_inputs", "to_host", "rope_tables",
            "embedding", "add_rms_norm", "linear", "rope_write_kv", "paged_attention",
            "silu_mul", "gather_rows", "copy_blocks")


def get_backend(name: str):
    """The backend module for 'cpu' or 'reference'; 'auto' is the CPU here."""
    if name in ("auto", "cpu"):
        from . import cpu
        return cpu
    if name == "reference":
        from . import reference
        return reference
    raise ValueError(f"backend={name!r} is not one of ('auto', 'cpu', 'reference')")

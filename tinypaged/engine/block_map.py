"""A text picture of the KV pool: one character per block, then each sequence's table."""
from __future__ import annotations

from .block_manager import BlockManager
from .sequence import Sequence

LEGEND = ("# in use, 2-9 shared by that many sequences, + by 10 or more, "
          "c cached (free, content kept), . free")
WIDTH = 64  # blocks per line


def block_char(bm: BlockManager, block_id: int) -> str:
    block = bm.blocks[block_id]
    if block.ref_count == 0:
        return "c" if bm.cached.get(block.hash) == block_id and block.hash is not None else "."
    if block.ref_count == 1:
        return "#"
    return str(block.ref_count) if block.ref_count < 10 else "+"


def render_block_map(bm: BlockManager, seqs: list[Sequence]) -> str:
    chars = [block_char(bm, b) for b in range(bm.num_blocks)]
    last = max((i for i, c in enumerate(chars) if c != "."), default=-1)
    shown = chars[:max(last + 1, min(WIDTH, len(chars)))]
    lines = [f"KV pool: {bm.num_blocks} blocks x {bm.block_size} tokens ({LEGEND})"]
    lines += ["".join(shown[i:i + WIDTH]) for i in range(0, len(shown), WIDTH)]
    if len(shown) < len(chars):
        lines.append(f"... and {len(chars) - len(shown)} more free blocks")
    for seq in seqs:
        table = " ".join(map(str, seq.block_table))
        lines.append(f"request {seq.request_id} sample {seq.sample_index}: {len(seq)} tokens "
                     f"in blocks [{table}]")
    return "\n".join(lines)

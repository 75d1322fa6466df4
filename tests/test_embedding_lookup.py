"""A token's embedding costs its own rows, never the table: for every packed kind and
every layout (PackedWeight, LanePacked, LinearWeight), the bytes a lookup allocates
are counted (tracemalloc sees every NumPy buffer) for a table of 64 rows and for one
of 64 x 4096 rows, and must be the same. The large table is the small one's first
group repeated by a zero stride, so it costs nothing to build and any work over the
whole table (the unpacking that cost Llama-3.2-1B 129 ms a token) would show as
hundreds of MB."""
import tracemalloc

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided
from test_lanes import KINDS, random_packed, width_for

from tinypaged.kernels.cpu import embedding
from tinypaged.kernels.cpu.lane_packed import LanePacked
from tinypaged.kernels.cpu.linear import LinearWeight

SMALL, REPEATS = 64, 4096  # rows of the small table; the large one has SMALL * REPEATS
TOKENS = np.array([3, 17, 40])


def repeated(a: np.ndarray | None, times: int) -> np.ndarray | None:
    """a's first outer entry (a row, or a group of 16 rows) repeated len(a) * times
    times by a zero stride: read-only, no memory of its own."""
    if a is None:
        return None
    return as_strided(a[:1], shape=(len(a) * times, *a.shape[1:]), strides=(0, *a.strides[1:]),
                      writeable=False)


def packed_layout(kind: str, times: int):
    weight = random_packed(np.random.default_rng(5), KINDS[kind], SMALL, width_for(kind, 512))
    return weight.with_rows(lambda a: repeated(a, times), SMALL * times)


def lane_layout(kind: str, times: int):
    laid = LanePacked.of(random_packed(np.random.default_rng(5), KINDS[kind], SMALL,
                                       width_for(kind, 512)))
    arrays = {name: repeated(getattr(laid, name), times)
              for name in ("quants", "scales", "mins", "supers", "fifths")}
    return LanePacked(laid.kind, (SMALL * times, laid.shape[1]), **arrays)


def float_layout(kind: str, times: int):
    rows = np.random.default_rng(5).standard_normal((SMALL, 512)).astype(np.float16)
    return LinearWeight.of(LinearWeight(rows).kind, repeated(rows.view(np.uint16), times))


def allocated_by_lookup(table) -> int:
    """Peak bytes allocated while looking up TOKENS (after one warm-up lookup)."""
    embedding(TOKENS, table)
    tracemalloc.start()
    try:
        embedding(TOKENS, table)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


LAYOUTS = [("PackedWeight", packed_layout, kind) for kind in KINDS] + \
          [("LanePacked", lane_layout, kind) for kind in KINDS] + [("LinearWeight", float_layout, "F16")]
SAME_AS = {"PackedWeight": TOKENS * 0, "LanePacked": TOKENS % 16, "LinearWeight": TOKENS * 0}


@pytest.mark.parametrize("layout,make,kind", LAYOUTS, ids=[f"{layout}-{kind}" for layout, _, kind in LAYOUTS])
def test_an_embedding_lookup_allocates_the_same_bytes_whatever_the_vocabulary(layout, make, kind):
    small, large = make(kind, 1), make(kind, REPEATS)
    assert large.shape[0] == SMALL * REPEATS
    # the large table repeats the small one's first row (a group of 16 rows when laid out)
    assert np.array_equal(embedding(TOKENS, large), embedding(SAME_AS[layout], small))
    small_bytes, large_bytes = allocated_by_lookup(small), allocated_by_lookup(large)
    row_bytes = 512 * 4 * len(TOKENS)  # the float32 rows returned
    assert small_bytes < 64 * row_bytes, (layout, kind, small_bytes)
    assert large_bytes <= small_bytes + 4096, (layout, kind, small_bytes, large_bytes)

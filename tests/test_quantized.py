"""Packed weights (Q8_0, Q4_0, Q4_1) on the CPU: the split layout against GGUF's own
block format, and the kernels against the NumPy reference: the dequantizer, the
rounding of activations that packed products use, and the products against the bit
oracle (packed_oracle.py), on fresh random weights and activations."""
import importlib

import numpy as np
import pytest
from packed_oracle import oracle_product

from tinypaged.kernels.cpu.gemm import gemm_narrow
from tinypaged.kernels import reference
from tinypaged.kernels.cpu.activations import quantize_activations
from tinypaged.kernels.cpu.common import PACKED_GEMV_MAX_ROWS
from tinypaged.kernels.cpu.lane_packed import LanePacked
from tinypaged.kernels.cpu.lanes_product import lanes_product
from tinypaged.kernels.cpu.tiles import widen_tile
from tinypaged.formats.quant_kind import Q4_0, Q4_1, Q8_0
from tinypaged.formats.ggml_quant import dequantize, quantize
from tinypaged.formats.packed import PackedWeight

TYPES = {"Q8_0": Q8_0, "Q4_0": Q4_0, "Q4_1": Q4_1}
cpu_linear = importlib.import_module("tinypaged.kernels.cpu.linear")  # (the package exports
#                                                                        a function of that name)


def random_matrix(rng, n, k, spread=1.0):
    w = (rng.standard_normal((n, k)) * spread).astype(np.float32)
    w[0, :32] = 0.0  # an all-zero block: scale 0
    return w


@pytest.mark.parametrize("name", TYPES)
def test_the_split_layout_holds_exactly_the_gguf_blocks(name):
    rng = np.random.default_rng(1)
    w = random_matrix(rng, 16, 256, spread=3.0)
    raw = quantize(w, TYPES[name])  # GGUF's block bytes
    weight = PackedWeight.from_bytes(raw, TYPES[name], w.shape)
    assert np.array_equal(weight.dequantize(), dequantize(raw.reshape(-1), TYPES[name], w.shape, name))
    assert weight.nbytes == raw.nbytes  # the same bytes, rearranged
    assert np.array_equal(quantize(weight.dequantize(), TYPES[name]), raw)  # and back


@pytest.mark.parametrize("name", TYPES)
def test_quantize_then_dequantize_is_within_a_rounding_step(name):
    rng = np.random.default_rng(2)
    w = random_matrix(rng, 16, 256, spread=3.0)
    back = PackedWeight.quantize(w, TYPES[name]).dequantize()
    blocks, back_blocks = w.reshape(-1, 32), back.reshape(-1, 32)
    if name == "Q8_0":  # q in [-127, 127]: half a step, plus the scale's float16 rounding
        bound = np.abs(blocks).max(1) / 127 * (0.5 + 127 * 2.0 ** -11)
    elif name == "Q4_0":  # q - 8 in [-8, 7], the largest magnitude at -8: a whole step
        bound = np.abs(blocks).max(1) / 8 * (1 + 16 * 2.0 ** -11)
    else:  # q in [0, 15] from the min: half a step, plus float16 scale and min
        bound = (blocks.max(1) - blocks.min(1)) / 15 * (0.5 + 15 * 2.0 ** -11) \
            + np.abs(blocks.min(1)) * 2.0 ** -11
    assert (np.abs(back_blocks - blocks) <= bound[:, None] + 1e-6).all()
    assert (back[0, :32] == 0).all()


def test_the_tile_kernel_widens_float16_and_bfloat16_bits_exactly():
    w = random_matrix(np.random.default_rng(3), 24, 128)
    bits = w.astype(np.float16).view(np.uint16)
    out = np.empty((10, 128), np.float32)
    widen_tile(bits, 7, out)
    assert np.array_equal(out, bits[7:17].view(np.float16).astype(np.float32))
    bf16 = (w.view(np.uint32) >> 16).astype(np.uint16).view(np.int16)
    widen_tile(bf16, 7, out)
    assert np.array_equal(out, (w[7:17].view(np.uint32) & 0xFFFF0000).view(np.float32))


def random_activations(rng, rows, k):
    """Rows of x with the blocks the rounding must get right: an all-zero block, a
    block whose values are exact halves of its step (ties round to even), and
    magnitudes 1e-3 to 1e3 apart."""
    x = (rng.standard_normal((rows, k)) * 10.0 ** rng.integers(-3, 4, (rows, k // 32)).repeat(32, 1))
    x[0, 32:64] = 0.0
    x[-1, :32] = np.arange(32) - 15.5  # steps of 15.5 / 127 ... : q = x * 127 / 16.5
    x[-1, 31] = 16.5
    return x.astype(np.float32)


def test_activations_quantize_as_the_reference_bit_for_bit():
    rng = np.random.default_rng(8)
    x = random_activations(rng, 5, 256)
    q, d, qsum = quantize_activations(x, len(x))
    want_q, want_d = reference.quantize_activations(x)
    assert np.array_equal(q, want_q) and np.array_equal(d, want_d)
    assert np.array_equal(qsum, want_q.reshape(5, -1, 32).sum(2, dtype=np.int32))
    assert (q[0, 32:64] == 0).all() and (d[0, 1] == 0) and np.abs(q).max() == 127
    q8, _, _ = quantize_activations(x, 8)  # padded with zero rows for the group GEMM
    assert q8.shape == (8, 256) and np.array_equal(q8[:5], q) and not q8[5:].any()
    rounded = reference.round_activations(x)  # the spec's own bound: half a step
    assert (np.abs(rounded - x) <= np.repeat(d, 32, axis=1) * (0.5 + 2.0 ** -20)).all()


def packed_product_bound(x, w):
    """|error| allowed of a packed product against round_activations(x) @ W.T in float64:
    float32 accumulation over K = 192 (and the rounding of the scaled block sums)."""
    return 1e-5 * (np.abs(x) @ np.abs(w).T) + 1e-6


def check_packed_layout(weight, want: np.ndarray) -> None:
    """weight dequantizes to want bit for bit, whole and by rows, and keeps its bits
    through take_rows (Q/K rows are reordered at load) and concatenate (stacks)."""
    assert np.array_equal(weight.dequantize(), want)
    assert np.array_equal(weight.dequantize(np.array([5, 0, 17])), want[[5, 0, 17]])
    rows = np.array([3, 9, 1])
    assert np.array_equal(weight.take_rows(rows).dequantize(), want[rows])
    both = type(weight).concatenate([weight, weight.take_rows(rows)])
    assert np.array_equal(both.dequantize(), np.concatenate([want, want[rows]]))


def lanes_of(x, weight) -> np.ndarray:
    """The CPU's product of x with a PackedWeight, laid out as at load."""
    return lanes_product(x, LanePacked.of(weight))


def check_decode_gemv(weight, x) -> np.ndarray:
    """The bit oracle of x (M, K) against the float64 product of the rounded x and the
    dequantized weight, each row alone against the batch, and the CPU's product (the
    GEMV for M <= 2, else the GEMM) against the oracle's bits: returns the product.
    (Every packed kind's tests call it.)"""
    w = weight.dequantize().astype(np.float64)
    rounded = reference.round_activations(x).astype(np.float64)
    got = oracle_product(x, weight)
    assert (np.abs(got - rounded @ w.T) <= packed_product_bound(rounded, w)).all()
    for m in range(len(x)):  # a row's result does not depend on the rows beside it
        assert np.array_equal(oracle_product(x[m:m + 1], weight)[0], got[m])
        assert np.array_equal(lanes_of(x[m:m + 1], weight)[0], got[m])
    assert np.array_equal(lanes_of(x, weight), got)
    return got


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("rows", [1, 3, 4])
def test_the_decode_gemv_equals_rounded_x_times_the_dequantized_weights(name, rows):
    """An integer dot product per block, against the float product of the rounded x."""
    rng = np.random.default_rng(4 + rows)
    weight = PackedWeight.quantize(random_matrix(rng, 70, 192), TYPES[name])
    x = random_activations(rng, rows, 192)
    got = check_decode_gemv(weight, x)
    # the stated cost of rounding x: at most half a step per value, times |W|
    w = weight.dequantize().astype(np.float64)
    half_step = np.repeat(reference.quantize_activations(x)[1], 32, axis=1) / 2
    exact = x.astype(np.float64) @ w.T
    assert (np.abs(got - exact) <= half_step @ np.abs(w).T + packed_product_bound(x, w)).all()


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("width", [448, 960])
def test_a_tall_matrix_gives_the_gemv_and_the_gemm_the_oracles_bits(name, width):
    """600 rows, so that the threads take uneven shares of 16-row groups and a partial
    last group: the GEMV's and the GEMM's rows are the oracle's bits, within the bound
    of the float64 product."""
    rng = np.random.default_rng(width)
    weight = PackedWeight.quantize(random_matrix(rng, 600, width), TYPES[name])
    x = random_activations(rng, 3, width)
    w = weight.dequantize().astype(np.float64)
    rounded = reference.round_activations(x).astype(np.float64)
    got = oracle_product(x, weight)
    bound = 1e-5 * (np.abs(rounded) @ np.abs(w).T) * (width / 192) + 1e-6
    assert (np.abs(got - rounded @ w.T) <= bound).all()
    assert np.array_equal(lanes_of(x[:PACKED_GEMV_MAX_ROWS], weight), got[:PACKED_GEMV_MAX_ROWS])
    assert np.array_equal(lanes_of(x, weight), got)


@pytest.mark.parametrize("name", ["F16", "BF16", "F32"])
@pytest.mark.parametrize("rows, n_out", [(5, 70), (6, 4), (17, 33), (64, 72)])
def test_the_small_batch_gemm_equals_widen_then_multiply(name, rows, n_out):
    """Odd and even batches, and row counts that are not a multiple of the kernel's
    group of four (its last group is shifted back)."""
    rng = np.random.default_rng(rows * n_out)
    w = random_matrix(rng, n_out, 192)
    if name == "F16":
        data = w.astype(np.float16).view(np.uint16)
        w = data.view(np.float16).astype(np.float64)
    elif name == "BF16":  # bits held as int16 (LinearWeight)
        data = (w.view(np.uint32) >> 16).astype(np.uint16).view(np.int16)
        w = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    else:
        data, w = w, w.astype(np.float64)
    x = rng.standard_normal((rows, 192)).astype(np.float32)
    out = np.full((rows, n_out), np.nan, np.float32)
    gemm_narrow(x, data, out)
    bound = 1e-5 * (np.abs(x) @ np.abs(w).T) + 1e-6  # float32 accumulation over K = 192
    assert (np.abs(out - x.astype(np.float64) @ w.T) <= bound).all()


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("rows, n_out", [(5, 70), (9, 16), (33, 40), (70, 33), (6, 8)])
def test_every_batch_gives_a_row_the_bits_of_the_gemv(name, rows, n_out):
    """The product at any M (the GEMM beyond a few rows; matrices under 16 rows in one
    padded group) equals the rounded-x product, and gives each row of x exactly the
    bits the oracle gives it alone: a result never depends on the batch around it."""
    rng = np.random.default_rng(rows * n_out)
    weight = PackedWeight.quantize(random_matrix(rng, n_out, 192), TYPES[name])
    x = random_activations(rng, rows, 192)
    rounded, w = reference.round_activations(x).astype(np.float64), weight.dequantize().astype(np.float64)
    got = lanes_of(x, weight)
    assert (np.abs(got - rounded @ w.T) <= packed_product_bound(rounded, w)).all()
    alone = np.concatenate([oracle_product(x[m:m + 1], weight) for m in range(rows)])
    assert np.array_equal(got, alone)


@pytest.mark.parametrize("name", TYPES)
def test_linear_takes_packed_products_for_every_batch_and_adds_the_bias(name):
    rng = np.random.default_rng(6)
    weight = PackedWeight.quantize(random_matrix(rng, 40, 64), TYPES[name])
    laid = LanePacked.of(weight)
    bias = rng.standard_normal(40).astype(np.float32)
    for rows in (1, PACKED_GEMV_MAX_ROWS, PACKED_GEMV_MAX_ROWS + 1, cpu_linear.NUMBA_MAX_ROWS + 1):
        x = rng.standard_normal((rows, 64)).astype(np.float32)
        assert np.array_equal(cpu_linear.linear(x, laid, bias), oracle_product(x, weight) + bias)
    with pytest.raises(AttributeError, match="product"):  # (prepare_weights lays it out first)
        cpu_linear.linear(x, weight)


def test_rows_can_be_reordered_and_odd_widths_are_refused():
    rng = np.random.default_rng(7)
    for ggml_type in TYPES.values():
        weight = PackedWeight.quantize(random_matrix(rng, 5, 64), ggml_type)
        order = np.array([4, 0, 3, 1, 2])
        assert np.array_equal(weight.take_rows(order).dequantize(), weight.dequantize()[order])
    with pytest.raises(ValueError, match="a Q4_1 matrix of 96 columns cannot be kept packed"):
        PackedWeight.quantize(random_matrix(rng, 2, 96), Q4_1)

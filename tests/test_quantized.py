"""Packed weights (Q8_0, Q4_0, Q4_1) on the CPU: the split layout against GGUF's own
block format, and the kernels against the NumPy reference dequantizer, on fresh
random weights and activations."""
import importlib

import numpy as np
import pytest

from tinypaged.kernels.cpu.gemm import gemm_narrow
from tinypaged.kernels.cpu.quantized import dequantize_rows, gemv_packed, matmul_packed
from tinypaged.model.ggml_quant import BF16, F16, Q4_0, Q4_1, Q8_0, dequantize, quantize
from tinypaged.model.packed import PackedWeight

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


@pytest.mark.parametrize("name", TYPES)
def test_the_dequantize_kernel_equals_the_reference_bit_for_bit(name):
    weight = PackedWeight.quantize(random_matrix(np.random.default_rng(3), 24, 128), TYPES[name])
    out = np.empty((10, 128), np.float32)
    mins = weight.mins if weight.mins is not None else weight.scales
    dequantize_rows(weight.ggml_type, weight.quants, weight.scales, mins, 7, out)
    assert np.array_equal(out, weight.dequantize(slice(7, 17)))


def test_the_dequantize_kernel_widens_float16_and_bfloat16_bits_exactly():
    w = random_matrix(np.random.default_rng(3), 24, 128)
    bits = w.astype(np.float16).view(np.uint16)
    out = np.empty((10, 128), np.float32)
    dequantize_rows(F16, bits, bits, bits, 7, out)
    assert np.array_equal(out, bits[7:17].view(np.float16).astype(np.float32))
    bf16 = (w.view(np.uint32) >> 16).astype(np.uint16).view(np.int16)
    dequantize_rows(BF16, bf16, bf16, bf16, 7, out)
    assert np.array_equal(out, (w[7:17].view(np.uint32) & 0xFFFF0000).view(np.float32))


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("rows", [1, 3, 4])
def test_the_decode_gemv_equals_dequantize_then_multiply(name, rows):
    rng = np.random.default_rng(4 + rows)
    weight = PackedWeight.quantize(random_matrix(rng, 70, 192), TYPES[name])
    x = rng.standard_normal((rows, 192)).astype(np.float32)
    w = weight.dequantize().astype(np.float64)
    expected = x.astype(np.float64) @ w.T
    bound = 1e-5 * (np.abs(x) @ np.abs(w).T) + 1e-6  # float32 accumulation over K = 192
    assert (np.abs(gemv_packed(x, weight) - expected) <= bound).all()


@pytest.mark.parametrize("name", [*TYPES, "F16", "BF16"])
@pytest.mark.parametrize("rows, n_out", [(5, 70), (6, 4), (17, 33), (64, 72)])
def test_the_small_batch_gemm_equals_dequantize_then_multiply(name, rows, n_out):
    """Odd and even batches, and row counts that are not a multiple of the kernel's
    group of four (its last group is shifted back)."""
    rng = np.random.default_rng(rows * n_out)
    w = random_matrix(rng, n_out, 192)
    if name == "F16":
        bits = w.astype(np.float16).view(np.uint16)
        args, w = (F16, bits, bits, bits), bits.view(np.float16).astype(np.float64)
    elif name == "BF16":  # bits held as int16 (LinearWeight)
        bits = (w.view(np.uint32) >> 16).astype(np.uint16).view(np.int16)
        args = (BF16, bits, None, None)
        w = (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    else:
        weight = PackedWeight.quantize(w, TYPES[name])
        mins = weight.mins if weight.mins is not None else weight.scales
        args, w = (weight.ggml_type, weight.quants, weight.scales, mins), weight.dequantize().astype(np.float64)
    x = rng.standard_normal((rows, 192)).astype(np.float32)
    out = np.full((rows, n_out), np.nan, np.float32)
    gemm_narrow(x, *args, out)
    bound = 1e-5 * (np.abs(x) @ np.abs(w).T) + 1e-6  # float32 accumulation over K = 192
    assert (np.abs(out - x.astype(np.float64) @ w.T) <= bound).all()


@pytest.mark.parametrize("name", TYPES)
def test_the_tiled_matmul_equals_dequantize_then_multiply(name, monkeypatch):
    from tinypaged.kernels.cpu import tiles
    monkeypatch.setattr(tiles, "TILE_FLOATS", 128 * 5)  # 5-row tiles: several, one partial
    rng = np.random.default_rng(5)
    weight = PackedWeight.quantize(random_matrix(rng, 23, 128), TYPES[name])
    x = rng.standard_normal((9, 128)).astype(np.float32)
    np.testing.assert_allclose(matmul_packed(x, weight), x @ weight.dequantize().T,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", TYPES)
def test_linear_picks_the_path_by_rows_and_adds_the_bias(name):
    rng = np.random.default_rng(6)
    weight = PackedWeight.quantize(random_matrix(rng, 40, 64), TYPES[name])
    bias = rng.standard_normal(40).astype(np.float32)
    gemv_rows, gemm_rows = cpu_linear.GEMV_MAX_ROWS, cpu_linear.NUMBA_MAX_ROWS
    mins = weight.mins if weight.mins is not None else weight.scales

    def gemm(x, weight):
        out = np.empty((len(x), 40), np.float32)
        gemm_narrow(x, weight.ggml_type, weight.quants, weight.scales, mins, out)
        return out
    for rows in (1, gemv_rows, gemv_rows + 1, gemm_rows, gemm_rows + 1):
        x = rng.standard_normal((rows, 64)).astype(np.float32)
        path = gemv_packed if rows <= gemv_rows else gemm if rows <= gemm_rows else matmul_packed
        assert np.array_equal(cpu_linear.linear(x, weight, bias), path(x, weight) + bias)


def test_rows_can_be_reordered_and_odd_widths_are_refused():
    rng = np.random.default_rng(7)
    for ggml_type in TYPES.values():
        weight = PackedWeight.quantize(random_matrix(rng, 5, 64), ggml_type)
        order = np.array([4, 0, 3, 1, 2])
        assert np.array_equal(weight.take_rows(order).dequantize(), weight.dequantize()[order])
    with pytest.raises(ValueError, match="a Q4_1 matrix of 96 columns cannot be kept packed"):
        PackedWeight.quantize(random_matrix(rng, 2, 96), Q4_1)

"""K-quants (Q4_K, Q5_K, Q6_K) kept packed on the CPU (formats/packed.py): the layout
against the `gguf` package's dequantizer bit for bit, and the products (the GEMV,
the GEMM) against the NumPy reference and against the bit oracle, on fresh random
super-blocks."""
import gguf
import numpy as np
import pytest
from random_blocks import K_QUANT_BLOCKS, random_k_quant
from packed_oracle import oracle_product
from test_quantized import (check_decode_gemv, check_packed_layout, lanes_of, packed_product_bound,
                            random_activations)

from tinypaged.kernels import reference
from tinypaged.formats.quant_kind import Q4_K, Q5_K, Q6_K
from tinypaged.formats.packed import PackedWeight

# kind -> (ours, the gguf package's, bytes a super-block, where its float16 scales sit)
KINDS = {name: (ours, getattr(gguf.GGMLQuantizationType, name), *K_QUANT_BLOCKS[name])
         for name, ours in (("Q4_K", Q4_K), ("Q5_K", Q5_K), ("Q6_K", Q6_K))}


def packed(rng, kind: str, n: int, k: int) -> tuple[PackedWeight, np.ndarray]:
    raw = random_k_quant(rng, kind, n, k)
    return PackedWeight.from_bytes(raw, KINDS[kind][0], (n, k)), raw


@pytest.mark.parametrize("kind", KINDS)
def test_the_layout_dequantizes_as_the_gguf_package_bit_for_bit(kind):
    rng = np.random.default_rng(11)
    weight, raw = packed(rng, kind, 24, 512)
    want = gguf.quants.dequantize(raw.reshape(24, -1), KINDS[kind][1])
    check_packed_layout(weight, want)
    # the file's bits a weight (4.5, 5.5, 6.5625), plus the 6-bit scales and mins
    # of Q4_K and Q5_K held a byte each (4.625, 5.625)
    assert weight.nbytes <= 1.03 * raw.nbytes


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 2, 5])
def test_the_decode_gemv_equals_rounded_x_times_the_dequantized_weights(kind, rows):
    rng = np.random.default_rng(12 + rows)
    weight, _ = packed(rng, kind, 40, 512)
    x = random_activations(rng, rows, 512)
    check_decode_gemv(weight, x)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows, n_out, width", [(5, 70, 256), (9, 16, 512), (33, 40, 768),
                                                (6, 8, 256)])
def test_every_batch_gives_a_row_the_bits_of_the_gemv(kind, rows, n_out, width):
    """The GEMV and the GEMM take the oracle's scales in its float32 steps and the
    same exact integer dots (Q6_K's with its sub-scales inside): any batch gives a
    row the oracle's bits for that row alone."""
    rng = np.random.default_rng(rows * n_out + width)
    weight, _ = packed(rng, kind, n_out, width)
    x = random_activations(rng, rows, width)
    rounded = reference.round_activations(x).astype(np.float64)
    w = weight.dequantize().astype(np.float64)
    got = lanes_of(x, weight)
    assert (np.abs(got - rounded @ w.T) <= packed_product_bound(rounded, w) * width / 192).all()
    alone = np.concatenate([oracle_product(x[m:m + 1], weight) for m in range(rows)])
    assert np.array_equal(got, alone)


def test_q6_k_at_its_extremes_stays_exact():
    """Every Q6_K weight at -32 with sub-scale -128 against x at +-127 (x = 127/128:
    a power-of-two step): each block's integer dot is 2 * 128 * 32 * 16 * 127 =
    16,646,144, just below 2^24, where the float form's sums would stop being exact.
    The oracle, the GEMV and the GEMM give the exact product."""
    n, k = 16, 256
    raw = np.zeros((n, 210), np.uint8)  # q = 0 everywhere: weight d * sc * -32
    raw[:, 192:208] = np.int8(-128).view(np.uint8)
    raw[:, 208:210] = np.array([2.0 ** -10], np.float16).view(np.uint8)
    weight = PackedWeight.from_bytes(raw.reshape(-1), Q6_K, (n, k))
    x = np.full((3, k), 127 / 128, np.float32)
    x[1] = -x[1]
    x[2, ::2] = -x[2, ::2]
    want = (x.astype(np.float64) @ weight.dequantize().astype(np.float64).T).astype(np.float32)
    assert np.array_equal(oracle_product(x, weight), want)
    assert np.array_equal(lanes_of(x[:1], weight), want[:1])  # the GEMV
    assert np.array_equal(lanes_of(x, weight), want)  # the GEMM


@pytest.mark.parametrize("kind", KINDS)
def test_a_row_width_of_partial_super_blocks_is_refused(kind):
    with pytest.raises(ValueError, match=f"{kind} matrix of 384 columns cannot be kept packed"):
        PackedWeight.from_bytes(np.zeros(2 * 384 // 256 * KINDS[kind][2], np.uint8),
                                KINDS[kind][0], (2, 384))

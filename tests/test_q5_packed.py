"""Q5_0 and Q5_1 kept packed on the CPU (formats/packed.py: Q4_x's nibbles plus a plane
of fifth bits): the layout against the `gguf` package's dequantizer bit for bit,
and the products (the GEMV, the GEMM) against the NumPy reference and against the
bit oracle, on fresh random blocks."""
import gguf
import numpy as np
import pytest
from random_blocks import Q5_BLOCKS, random_q5
from packed_oracle import oracle_product
from test_quantized import (check_decode_gemv, check_packed_layout, lanes_of, packed_product_bound,
                            random_activations)

from tinypaged.kernels import reference
from tinypaged.formats.quant_kind import Q5_0, Q5_1
from tinypaged.formats.packed import PackedWeight

KINDS = {name: (ours, Q5_BLOCKS[name], getattr(gguf.GGMLQuantizationType, name))
         for name, ours in (("Q5_0", Q5_0), ("Q5_1", Q5_1))}


def packed(rng, kind: str, n: int, k: int) -> tuple[PackedWeight, np.ndarray]:
    raw = random_q5(rng, kind, n, k)
    return PackedWeight.from_bytes(raw, KINDS[kind][0], (n, k)), raw


@pytest.mark.parametrize("kind", KINDS)
def test_the_layout_dequantizes_as_the_gguf_package_bit_for_bit(kind):
    rng = np.random.default_rng(21)
    weight, raw = packed(rng, kind, 24, 512)
    want = gguf.quants.dequantize(raw.reshape(24, -1), KINDS[kind][2])
    check_packed_layout(weight, want)
    assert weight.nbytes == raw.nbytes  # 5.5 / 6 bits a weight, as the file


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 2, 5])
def test_the_decode_gemv_equals_rounded_x_times_the_dequantized_weights(kind, rows):
    rng = np.random.default_rng(22 + rows)
    weight, _ = packed(rng, kind, 40, 576)
    x = random_activations(rng, rows, 576)
    check_decode_gemv(weight, x)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows, n_out, width", [(5, 70, 192), (9, 16, 128), (33, 40, 640)])
def test_every_batch_gives_a_row_the_bits_of_the_gemv(kind, rows, n_out, width):
    """The GEMM (the fifth bits laid into its chunks) gives a row the oracle's bits
    for that row alone, within the reference's bound."""
    rng = np.random.default_rng(rows * n_out + width)
    weight, _ = packed(rng, kind, n_out, width)
    x = random_activations(rng, rows, width)
    rounded = reference.round_activations(x).astype(np.float64)
    w = weight.dequantize().astype(np.float64)
    got = lanes_of(x, weight)
    assert (np.abs(got - rounded @ w.T) <= packed_product_bound(rounded, w) * width / 192).all()
    alone = np.concatenate([oracle_product(x[m:m + 1], weight) for m in range(rows)])
    assert np.array_equal(got, alone)


@pytest.mark.parametrize("kind", KINDS)
def test_a_row_width_of_an_odd_number_of_blocks_is_refused(kind):
    with pytest.raises(ValueError, match=f"{kind} matrix of 96 columns cannot be kept packed"):
        PackedWeight.from_bytes(random_q5(np.random.default_rng(0), kind, 2, 96),
                                KINDS[kind][0], (2, 96))

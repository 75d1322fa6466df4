"""Q4_K kept packed on the CPU (model/packed.py): its layout against the `gguf`
package's dequantizer bit for bit, and its products through the Q4_1 kernels with
computed scales (packed_terms.scale_of / min_of) against the NumPy reference, on
fresh random super-blocks."""
import gguf
import numpy as np
import pytest
from test_quantized import check_decode_gemv, packed_product_bound, random_activations

from tinypaged.kernels import reference
from tinypaged.kernels.cpu.packed_gemm import HAS_VNNI, gemm_packed
from tinypaged.kernels.cpu.quantized import gemv_packed, packed_product
from tinypaged.model.ggml_quant import Q4_K
from tinypaged.model.packed import PackedWeight


def random_q4_k(rng, n: int, k: int) -> np.ndarray:
    """GGUF bytes of an (n, k) Q4_K matrix: random float16 d and dmin (one super-block
    with both zero), random 6-bit scales and mins, random nibbles."""
    blocks = rng.integers(0, 256, (n * k // 256, 144), dtype=np.uint8)
    d = (np.abs(rng.standard_normal(len(blocks))) * 0.02).astype(np.float16)
    dmin = (np.abs(rng.standard_normal(len(blocks))) * 0.01).astype(np.float16)
    d[0] = dmin[0] = 0
    blocks[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    blocks[:, 2:4] = dmin.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


def gguf_dequantize(raw: np.ndarray, shape) -> np.ndarray:
    return gguf.quants.dequantize(raw.reshape(shape[0], -1), gguf.GGMLQuantizationType.Q4_K)


def test_the_layout_dequantizes_as_the_gguf_package_bit_for_bit():
    rng = np.random.default_rng(11)
    raw = random_q4_k(rng, 24, 512)
    weight = PackedWeight.from_bytes(raw, Q4_K, (24, 512))
    want = gguf_dequantize(raw, (24, 512))
    assert np.array_equal(weight.dequantize(), want)
    assert np.array_equal(weight.dequantize(np.array([5, 0, 17])), want[[5, 0, 17]])
    rows = np.array([3, 9, 1])  # (Q/K rows reordered at load; stacks take row ranges)
    assert np.array_equal(weight.take_rows(rows).dequantize(), want[rows])
    both = PackedWeight.concatenate([weight, weight.take_rows(rows)])
    assert np.array_equal(both.dequantize(), np.concatenate([want, want[rows]]))
    assert weight.nbytes <= 1.03 * raw.nbytes  # 4.625 bits a weight against 4.5


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_the_decode_gemv_equals_rounded_x_times_the_dequantized_weights(rows):
    rng = np.random.default_rng(12 + rows)
    weight = PackedWeight.from_bytes(random_q4_k(rng, 40, 512), Q4_K, (40, 512))
    x = random_activations(rng, rows, 512)
    check_decode_gemv(weight, x)


@pytest.mark.parametrize("rows, n_out", [(5, 70), (9, 16), (33, 40), (6, 8)])
def test_every_batch_gives_a_row_the_bits_of_the_gemv(rows, n_out):
    """The group GEMM (both its forms) and the GEMV take the same scales and mins
    in the same float32 steps: any batch gives a row the one-row GEMV's bits."""
    rng = np.random.default_rng(rows * n_out + 1)
    weight = PackedWeight.from_bytes(random_q4_k(rng, n_out, 256), Q4_K, (n_out, 256))
    x = random_activations(rng, rows, 256)
    rounded = reference.round_activations(x).astype(np.float64)
    w = weight.dequantize().astype(np.float64)
    got = packed_product(x, weight)
    assert (np.abs(got - rounded @ w.T) <= packed_product_bound(rounded, w)).all()
    alone = np.concatenate([gemv_packed(x[m:m + 1], weight) for m in range(rows)])
    assert np.array_equal(got, alone)
    if n_out >= 16:
        for vnni in [False] + [True] * HAS_VNNI:
            out = np.full((rows, n_out), np.nan, np.float32)
            gemm_packed(x, weight.quants, weight.scales, weight.mins, out, vnni=vnni,
                        supers=weight.supers)
            assert np.array_equal(out, alone), vnni


def test_a_row_width_of_partial_super_blocks_is_refused():
    with pytest.raises(ValueError, match="Q4_K matrix of 384 columns cannot be kept packed"):
        PackedWeight.from_bytes(np.zeros(2 * 384 // 256 * 144, np.uint8), Q4_K, (2, 384))

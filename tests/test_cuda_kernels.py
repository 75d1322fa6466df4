"""Every CUDA kernel against the NumPy reference: on numba's CUDA simulator when
there is no GPU (tiny shapes: it runs one Python thread per CUDA thread), for real
on a GPU (marker `cuda`)."""
import numpy as np
import pytest
from numba import cuda

from tinypaged.batch.attention_metadata import AttentionMetadata
from tinypaged.kernels import reference
from tinypaged.kernels.cuda.backend import CudaBackend
from tinypaged.kernels.cuda import attention, matmul, prefill_attention
from tinypaged.kernels.cuda.device_weights import DeviceFloat

pytestmark = pytest.mark.cuda
TOL = dict(rtol=2e-5, atol=2e-5)


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.fixture
def gpu():
    return CudaBackend()


@pytest.mark.parametrize("rows", [1, 3, 13])  # 1 and 3: decode GEMV; 13: tiled matmul
@pytest.mark.parametrize("weight_dtype", [np.float16, np.float32])
def test_linear(gpu, rows, weight_dtype):
    rng = np.random.default_rng(rows)
    w = rand(rng, 21, 37).astype(weight_dtype).astype(np.float32)  # values the device holds exactly
    x, bias = rand(rng, rows, 37), rand(rng, 21)
    dev_w = DeviceFloat(w, weight_dtype)
    assert (rows <= matmul.GEMV_MAX_ROWS) == (rows < 13)
    got = gpu.linear(cuda.to_device(x), dev_w, cuda.to_device(bias)).copy_to_host()
    np.testing.assert_allclose(got, reference.linear(x, w, bias), **TOL)
    got = gpu.linear(cuda.to_device(x), dev_w).copy_to_host()
    np.testing.assert_allclose(got, reference.linear(x, w), **TOL)


@pytest.mark.parametrize("sms", [1, 16, 64])  # one split; 2 splits; 5 (more than SPLITS_AT_ONCE)
def test_tiled_product_over_several_tiles_and_splits_of_k(gpu, sms):
    """M = 20, N = 21: 3 x 3 tiles, the last ones partly outside; K = 100: 13 slices of the
    simulator's 8, the last partly. With fewer tiles than SMs, K is split and the last
    block of each tile adds the splits' partials; it leaves the arrival counts at zero
    for the next launch (the second product here counts from them)."""
    from tinypaged.kernels.cuda import tiled_matmul
    rng = np.random.default_rng(sms)
    w = rand(rng, 21, 100).astype(np.float16)
    x, bias = rand(rng, 20, 100), rand(rng, 21)
    gpu.launcher.sms = sms
    splits, k_span = tiled_matmul.tiled_split(20, 21, 100, sms)
    assert splits == {1: 1, 16: 2, 64: 5}[sms] and k_span % tiled_matmul.DEPTH == 0
    dev_w, dev_x, dev_b = DeviceFloat(w, np.float16), cuda.to_device(x), cuda.to_device(bias)
    for with_bias in (True, False):
        got = gpu.linear(dev_x, dev_w, dev_b if with_bias else None).copy_to_host()
        want = reference.linear(x, w.astype(np.float32), bias if with_bias else None)
        np.testing.assert_allclose(got, want, **TOL)
    assert not gpu.launcher.arrival_counts(3, 3).copy_to_host().any()


@pytest.mark.parametrize("sms", [1, 64])  # K whole; K split, the partials merged
def test_fused_tiled_qkv_and_gate_up_silu_over_tiles_that_straddle_matrices(gpu, sms):
    """20 rows (tiles of 8 on the simulator, the last partial). q | k | v = 20 | 6 | 6
    columns side by side: tiles hold the end of q and the start of k, of k and v; biases.
    gate/up over 18 rows: each tile takes 4 rows of gate and the same 4 of up (the last
    tile half empty), SiLU applied where a thread holds both. One launch each."""
    from tinypaged.kernels.cuda import tiled_matmul
    rng = np.random.default_rng(sms + 5)
    gpu.launcher.sms = sms
    x = rand(rng, 20, 40)
    wq, wk, wv = (rand(rng, n, 40).astype(np.float16) for n in (20, 6, 6))
    biases = [rand(rng, n) for n in (20, 6, 6)]
    want = reference.qkv_proj(x, *(w.astype(np.float32) for w in (wq, wk, wv)), *biases)
    before = gpu.launcher.launches
    got = gpu.qkv_proj(cuda.to_device(x), *(DeviceFloat(w, np.float16) for w in (wq, wk, wv)),
                       *(cuda.to_device(b) for b in biases))
    assert gpu.launcher.launches - before == 1
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.copy_to_host(), w, **TOL)
    wg, wu = (rand(rng, 18, 40).astype(np.float16) for _ in range(2))
    want = reference.gate_up_silu(x, wg.astype(np.float32), wu.astype(np.float32))
    before = gpu.launcher.launches
    got = gpu.gate_up_silu(cuda.to_device(x), DeviceFloat(wg, np.float16), DeviceFloat(wu, np.float16))
    assert gpu.launcher.launches - before == 1
    np.testing.assert_allclose(got.copy_to_host(), want, **TOL)
    assert tiled_matmul.tiled_split(20, tiled_matmul.gate_up_columns(18), 40, sms)[0] == (1 if sms == 1 else 2)
    assert not gpu.launcher.arrival_counts(3, 5).copy_to_host().any()


def test_tiled_split_fills_the_sms_only_where_the_tiles_do_not():
    """In tiles and slices (the GPU's 64 x 64 and 16: a 2,048-row prompt over SmolLM2's
    576 x 576, then batch 64 there, 16 rows over 1,536 outputs, 64 over a 1,536-wide K)."""
    from tinypaged.kernels.cuda.tiled_matmul import DEPTH, MIN_SPLIT_SLICES, TILE, tiled_split
    assert tiled_split(32 * TILE, 9 * TILE, 36 * DEPTH, 132) == (1, 36 * DEPTH)
    for row_tiles, col_tiles, slices in ((1, 9, 36), (1, 24, 36), (1, 9, 96), (0.6, 1, 2.5)):
        rows, cols, width = int(row_tiles * TILE), col_tiles * TILE, int(slices * DEPTH)
        splits, k_span = tiled_split(rows, cols, width, 132)
        assert k_span % DEPTH == 0 and k_span >= min(-(-width // DEPTH), MIN_SPLIT_SLICES) * DEPTH
        assert (splits - 1) * k_span < width <= splits * k_span  # no split is empty
        tiles = -(-cols // TILE) * -(-rows // TILE)
        assert splits * tiles < 132 + tiles  # the SMs filled, a wave at most
        assert (splits > 1) == (-(-width // DEPTH) >= 2 * MIN_SPLIT_SLICES)  # (the last: too short)


@pytest.mark.parametrize("blocks", [None, 2])  # the simulator's two blocks; 45, a block a row
def test_warp_gemv_over_long_rows_and_every_decode_row(gpu, blocks):
    """K = 300: a block's threads split a row into FLOAT_VEC-weight chunks (GEMV_ROW_WARPS
    warps cover 256 weights a warp a step, the last step partly), then sum across warps;
    M = 8 = GEMV_MAX_ROWS; two blocks stride over the 45 rows, or a block a row."""
    rng = np.random.default_rng(8)
    w = rand(rng, 45, 300).astype(np.float16)
    x, bias = rand(rng, matmul.GEMV_MAX_ROWS, 300), rand(rng, 45)
    out = cuda.device_array((x.shape[0], 45), np.float32)
    grid = blocks or matmul.gemv_blocks(45)
    matmul.gemv_rows[grid, matmul.GEMV_ROW_THREADS](cuda.to_device(x), cuda.to_device(w),
                                               cuda.to_device(bias), True, out)
    np.testing.assert_allclose(out.copy_to_host(), reference.linear(x, w.astype(np.float32), bias),
                               **TOL)


@pytest.mark.parametrize("rows, blocks", [(45, None), (45, 2), (44, 3)])
def test_paired_gemv_takes_rows_two_a_block(gpu, rows, blocks):
    """gemv_paired_rows (a matrix of more rows than a wave: lm_head): rows p and p + 23 of
    45 in one pass, the middle row of an odd count alone; a block a pair, or fewer
    blocks striding over the pairs; bias, K = 300, every decode row of x."""
    rng = np.random.default_rng(9)
    w = rand(rng, rows, 300).astype(np.float16)
    x, bias = rand(rng, matmul.GEMV_MAX_ROWS, 300), rand(rng, rows)
    out = cuda.to_device(np.full((x.shape[0], rows), np.nan, np.float32))
    grid = blocks or matmul.gemv_blocks(-(-rows // 2))
    matmul.gemv_paired_rows[grid, matmul.GEMV_ROW_THREADS](cuda.to_device(x), cuda.to_device(w),
                                                         cuda.to_device(bias), True, out)
    np.testing.assert_allclose(out.copy_to_host(), reference.linear(x, w.astype(np.float32), bias),
                               **TOL)


@pytest.mark.parametrize("width", [300, 8, 5])  # steps past the row's end; one step; K < FLOAT_VEC
@pytest.mark.parametrize("paired, rows, blocks", [(False, 45, None), (False, 45, 2), (True, 45, None),
                                                  (True, 44, 3)])
def test_one_row_gemvs_against_the_reference(gpu, width, paired, rows, blocks):
    """gemv_one_row and gemv_one_row_paired (batch 1: each step's loads before its sums):
    a last step past the row's end reads the row's last FLOAT_VEC values, the other
    threads' zeroed; a row shorter than FLOAT_VEC takes row_dots' loop; bias; blocks
    a row (pair) or fewer, striding."""
    rng = np.random.default_rng(width + rows)
    w = rand(rng, rows, width).astype(np.float16)
    x, bias = rand(rng, 1, width), rand(rng, rows)
    kernel = matmul.gemv_one_row_paired if paired else matmul.gemv_one_row
    out = cuda.to_device(np.full((1, rows), np.nan, np.float32))
    grid = blocks or matmul.gemv_blocks(-(-rows // 2) if paired else rows)
    kernel[grid, matmul.GEMV_ROW_THREADS](cuda.to_device(x), cuda.to_device(w), cuda.to_device(bias), True, out)
    np.testing.assert_allclose(out.copy_to_host(), reference.linear(x, w.astype(np.float32), bias), **TOL)


def test_a_product_past_a_waves_rows_takes_them_in_pairs(gpu):
    """DeviceFloat.product picks the paired GEMV past PAIRED_FROM_ROWS rows (one launch,
    half the blocks) and the plain one up to it, the one-row forms for one row of x,
    each equal to the reference."""
    from tinypaged.kernels.cuda.step_recording import StepRecording
    rng = np.random.default_rng(10)
    over, at = matmul.PAIRED_FROM_ROWS + 1, matmul.PAIRED_FROM_ROWS
    for rows, x_rows, kernel in ((over, 1, matmul.gemv_one_row_paired), (at, 1, matmul.gemv_one_row),
                                 (over, 2, matmul.gemv_paired_rows), (at, 2, matmul.gemv_rows)):
        w = rand(rng, rows, 8).astype(np.float16)
        x = rand(rng, x_rows, 8)
        weights = gpu.prepare_weights({"w": w})
        recording = StepRecording()
        with gpu.recording(recording):
            got = gpu.linear(cuda.to_device(x), weights["w"])
        assert [launch[0] for launch in recording.launches] == [kernel]
        np.testing.assert_allclose(got.copy_to_host(), reference.linear(x, w.astype(np.float32)), **TOL)


def _one_packed_matrix(rng, type_name: str, rows: int, width: int):
    """A PackedWeight of one kind: Q8_0 and Q4_x quantized from random floats, Q5_x and
    the K-quants random blocks as a file holds them (tests/random_blocks.py)."""
    from random_blocks import K_QUANT_BLOCKS, random_k_quant, random_q5

    from tinypaged.formats import quant_kind
    from tinypaged.formats.packed import PackedWeight
    kind = getattr(quant_kind, type_name)
    if type_name in ("Q8_0", "Q4_0", "Q4_1"):
        return PackedWeight.quantize(rand(rng, rows, width), kind)
    blocks = random_k_quant if type_name in K_QUANT_BLOCKS else random_q5
    return PackedWeight.from_bytes(blocks(rng, type_name, rows, width), kind, (rows, width))


@pytest.mark.parametrize("type_name, width, x_rows, rows, blocks", [
    *((kind, width, matmul.GEMV_MAX_ROWS, rows, blocks) for kind, width in (("Q8_0", 96), ("Q4_K", 256))
      for rows, blocks in ((45, None), (44, 3))),
    # (one row of x: an odd count's middle row and fewer blocks than pairs at once)
    *((kind, width, 1, 45, 3) for kind, width in (("Q4_K", 256), ("Q6_K", 256), ("Q4_1", 128), ("Q5_0", 128)))])
def test_packed_paired_gemv_takes_rows_two_a_block(gpu, type_name, width, x_rows, rows, blocks):
    """The packed kinds' paired GEMV (Q8_0: lm_head of the default GGUF and Gemma 3's;
    Q4_K; for one row of x, read as words, Q6_K's (the Q4_K_M files' lm_head), Q4_x's,
    Q5_0's too): rows p and p + ceil(N / 2) in one pass, an odd count's middle row
    alone; a block a pair, or fewer blocks striding over the pairs; bias, every decode
    row of x."""
    from tinypaged.kernels.cuda.device_weights import GEMV_PAIRED, DevicePacked
    rng = np.random.default_rng(11)
    packed = _one_packed_matrix(rng, type_name, rows, width)
    matrix = DevicePacked(packed)
    kernel = matrix.kernels.paired if x_rows > 1 else matrix.kernels.one_row[GEMV_PAIRED]
    x, bias = rand(rng, x_rows, width) / 8, rand(rng, rows)
    rounded = reference.round_activations(x)
    out = cuda.to_device(np.full((x.shape[0], rows), np.nan, np.float32))
    grid = blocks or matmul.gemv_blocks(-(-rows // 2))
    kernel[grid, matmul.GEMV_ROW_THREADS](cuda.to_device(rounded), matrix.decode, cuda.to_device(bias), True, out)
    want = rounded.astype(np.float64) @ packed.dequantize().astype(np.float64).T + bias
    terms = np.abs(rounded) @ np.abs(packed.dequantize()).T  # (float32 sums of the K-quants' large terms)
    assert (np.abs(out.copy_to_host() - want) <= TOL["atol"] + TOL["rtol"] * np.abs(want) + 1e-6 * terms).all()


def test_a_packed_product_past_a_waves_rows_takes_them_in_pairs(gpu):
    """DevicePacked.product picks its kind's paired GEMV past PAIRED_FROM_ROWS rows (Q8_0),
    the plain one up to it, for one row of x the one-row family's, each equal to the
    reference; Q6_K (its 8-row pair and q|k|v spilled) has both for one row of x only,
    Q5_K no pair at all."""
    from tinypaged.formats.quant_kind import Q5_K, Q6_K, Q8_0
    from tinypaged.kernels.cuda import kquant_matmul, packed_matmul
    from tinypaged.kernels.cuda.device_weights import GEMV_PAIRED, GEMV_QKV, PACKED_KERNELS, decode_gemv
    from tinypaged.kernels.cuda.step_recording import StepRecording
    rng = np.random.default_rng(12)
    over, one_row = matmul.PAIRED_FROM_ROWS + 1, packed_matmul.ONE_ROW_FAMILIES[Q8_0]
    six = PACKED_KERNELS[Q6_K]
    assert six.paired is None and kquant_matmul.DECODE_KERNELS[Q6_K][3] is None
    assert decode_gemv(six, GEMV_PAIRED, 2) is None and decode_gemv(six, GEMV_QKV, 8) is None
    assert decode_gemv(six, GEMV_PAIRED, 1) is kquant_matmul.ONE_ROW_KERNELS[Q6_K][3] is not None
    assert decode_gemv(PACKED_KERNELS[Q5_K], GEMV_PAIRED, 1) is None
    assert decode_gemv(six, GEMV_QKV, 1) is kquant_matmul.ONE_ROW_KERNELS[Q6_K][1]
    for type_name, rows, width, x_rows, kernel in (
            ("Q8_0", over, 32, 2, packed_matmul.gemv_q8_0_paired), ("Q8_0", over, 32, 1, one_row[3]),
            ("Q8_0", matmul.PAIRED_FROM_ROWS, 32, 2, packed_matmul.gemv_q8_0),
            ("Q8_0", matmul.PAIRED_FROM_ROWS, 32, 1, one_row[0])):
        packed = _one_packed_matrix(rng, type_name, rows, width)
        x = rand(rng, x_rows, width)
        weights = gpu.prepare_weights({"w": packed})
        recording = StepRecording()
        with gpu.recording(recording):
            got = gpu.linear(cuda.to_device(x), weights["w"])
        assert [launch[0] for launch in recording.launches][-1] is kernel
        want = reference.linear(x, reference.prepare_weights({"w": packed})["w"])
        np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-4, atol=1e-4)


def test_activations_round_as_the_reference_bit_for_bit(gpu):
    """The rounding that products with packed weights apply to x first: zero blocks,
    exact ties (round half to even) and magnitudes far apart included."""
    rng = np.random.default_rng(21)
    x = rand(rng, 3, 96) * np.float32(10.0) ** rng.integers(-3, 4, (3, 3)).repeat(32, 1).astype(np.float32)
    x[0, 32:64] = 0.0
    x[2, :32] = np.arange(32) - 15.5  # values at halves of a step
    x[2, 31] = 16.5
    got = gpu.round_activations_of(cuda.to_device(x)).copy_to_host()
    assert np.array_equal(got, reference.round_activations(x))


def _packed_matrices(rng, type_name: str, width: int) -> dict:
    """Five small packed matrices of one kind: quantized from random floats (Q8_0, Q4_x),
    or random blocks as a file holds them (Q5_x, K-quants: tests/random_blocks.py)."""
    from random_blocks import K_QUANT_BLOCKS, Q5_BLOCKS, random_k_quant, random_q5

    from tinypaged.formats import quant_kind
    from tinypaged.formats.packed import PackedWeight
    ggml_type = getattr(quant_kind, type_name)
    shapes = (("q", 16), ("k", 8), ("v", 8), ("g", 20), ("u", 20))
    if type_name in K_QUANT_BLOCKS:
        return {n: PackedWeight.from_bytes(random_k_quant(rng, type_name, rows, width), ggml_type,
                                           (rows, width)) for n, rows in shapes}
    if type_name in Q5_BLOCKS:
        return {n: PackedWeight.from_bytes(random_q5(rng, type_name, rows, width), ggml_type,
                                           (rows, width)) for n, rows in shapes}
    return {n: PackedWeight.quantize(rand(rng, rows, width), ggml_type) for n, rows in shapes}


@pytest.mark.parametrize("type_name, width", [("Q8_0", 320), ("Q4_0", 320), ("Q4_1", 320),
                                              ("Q5_0", 320), ("Q5_1", 320), ("Q4_K", 512),
                                              ("Q5_K", 512), ("Q6_K", 512)])
def test_packed_weights_go_up_packed_and_their_products_take_the_rounded_x(type_name, width):
    """prepare_weights uploads packed matrices as they are held (DevicePacked: the
    host's bytes); linear, qkv_proj and gate_up_silu round x for them and multiply
    with the packed GEMVs (1 row: the one-row family's, q|k|v fused for every kind; 2
    rows) or the tiled product dequantizing W's tiles (11), as the reference does and
    as the CPU backend's integer kernels do.
    K = 320: lanes take several 4-byte chunks of a row, nibble rows fold at 160; the
    K-quants' 512: two super-blocks, folding at the second."""
    from tinypaged.kernels.cuda.device_weights import DevicePacked
    rng = np.random.default_rng(22)
    packed = _packed_matrices(rng, type_name, width)
    gpu = CudaBackend(weight_dtype=np.float32)
    dev, ref = gpu.prepare_weights(dict(packed)), reference.prepare_weights(dict(packed))
    assert isinstance(dev["q"], DevicePacked)
    assert dev["q"].arrays[0].copy_to_host().tobytes() == packed["q"].quants.tobytes()
    assert dev["q"].nbytes <= packed["q"].nbytes + 8  # (1-element placeholders)
    def close(got, want, x, name):
        """Within TOL, or float32's rounding of the sum of |x w| over K (the Q5 and
        K-quant matrices' random blocks make sums of hundreds from terms of ~10)."""
        terms = np.abs(reference.round_activations(x)) @ np.abs(packed[name].dequantize()).T
        assert (np.abs(got - want) <= TOL["atol"] + TOL["rtol"] * np.abs(want) + 1e-6 * terms).all()
    from tinypaged.kernels import cpu
    # (the CPU backend takes its weights over, laying matrices out in their own memory)
    on_cpu = cpu.prepare_weights({k: w.take_rows(np.arange(w.shape[0])) for k, w in packed.items()})
    for rows in (1, 2, 11):  # (the one-row family's GEMVs, the 8-row ones', the tiled products)
        x = rand(rng, rows, width) / 8  # (gates of hundreds: the simulator's exp overflows)
        got = gpu.linear(cuda.to_device(x), dev["q"]).copy_to_host()
        close(got, reference.linear(x, ref["q"]), x, "q")
        close(got, cpu.linear(x, on_cpu["q"]), x, "q")  # and the CPU backend's kernels
        got = gpu.qkv_proj(cuda.to_device(x), dev["q"], dev["k"], dev["v"])
        for g, w, name in zip(got, reference.qkv_proj(x, ref["q"], ref["k"], ref["v"]), "qkv"):
            close(g.copy_to_host(), w, x, name)
        with np.errstate(over="ignore"):  # (exp(-gate) of a gate of -100 is inf: SiLU -0)
            got = gpu.gate_up_silu(cuda.to_device(x), dev["g"], dev["u"]).copy_to_host()
            want = reference.gate_up_silu(x, ref["g"], ref["u"])
        # silu(g) * u of two ~20-sized sums: float32 rounding of ~1e-6 of g u (~400)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-3)
        w = packed["q"].dequantize().astype(np.float64)
        unrounded = x.astype(np.float64) @ w.T
        assert not np.allclose(reference.linear(x, ref["q"]), unrounded, **TOL)  # it matters
        # the stated cost of rounding x: at most half a step per value, times |W|
        half_step = np.repeat(reference.quantize_activations(x)[1], 32, axis=1) / 2
        got = gpu.linear(cuda.to_device(x), dev["q"]).copy_to_host()
        assert (np.abs(got - unrounded) <= half_step @ np.abs(w).T + 1e-5 * (np.abs(x) @ np.abs(w).T)).all()


@pytest.mark.parametrize("rows", [2, 11])  # fused GEMV kernels; tiled matmuls
@pytest.mark.parametrize("with_bias", [True, False])
def test_qkv_proj_and_gate_up_silu(gpu, rows, with_bias):
    rng = np.random.default_rng(rows + with_bias)
    x = rand(rng, rows, 24)
    wq, wk, wv = (rand(rng, n, 24).astype(np.float16) for n in (16, 8, 8))
    biases = [rand(rng, n) for n in (16, 8, 8)] if with_bias else [None] * 3
    want = reference.qkv_proj(x, *(w.astype(np.float32) for w in (wq, wk, wv)), *biases)
    dev_b = [cuda.to_device(b) if b is not None else None for b in biases]
    got = gpu.qkv_proj(cuda.to_device(x), *(DeviceFloat(w, np.float16) for w in (wq, wk, wv)), *dev_b)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.copy_to_host(), w, **TOL)
    wg, wu = (rand(rng, 20, 24).astype(np.float16) for _ in range(2))
    want = reference.gate_up_silu(x, wg.astype(np.float32), wu.astype(np.float32))
    got = gpu.gate_up_silu(cuda.to_device(x), DeviceFloat(wg, np.float16), DeviceFloat(wu, np.float16))
    np.testing.assert_allclose(got.copy_to_host(), want, **TOL)


def test_add_rms_norm_silu_and_gathers(gpu):
    rng = np.random.default_rng(1)
    x, r, w = rand(rng, 3, 40), rand(rng, 3, 40), rand(rng, 40)
    want_h, want_r = reference.add_rms_norm(x, r, w, 1e-5)
    dev_r = cuda.to_device(r)
    h, new_r = gpu.add_rms_norm(cuda.to_device(x), dev_r, cuda.to_device(w), 1e-5)
    np.testing.assert_allclose(h.copy_to_host(), want_h, **TOL)
    np.testing.assert_allclose(new_r.copy_to_host(), want_r, **TOL)
    h, first_r = gpu.add_rms_norm(cuda.to_device(x), None, cuda.to_device(w), 1e-5)
    np.testing.assert_allclose(h.copy_to_host(), reference.rms_norm(x, w, 1e-5), **TOL)
    np.testing.assert_array_equal(first_r.copy_to_host(), x)
    gate, up = rand(rng, 2, 30) * 3, rand(rng, 2, 30)
    got = gpu.silu_mul(cuda.to_device(gate), cuda.to_device(up)).copy_to_host()
    np.testing.assert_allclose(got, reference.silu_mul(gate, up), **TOL)
    table, ids = rand(rng, 10, 12), np.array([7, 0, 7, 3], np.int32)
    np.testing.assert_array_equal(gpu.embedding(cuda.to_device(ids), cuda.to_device(table))
                                  .copy_to_host(), table[ids])
    np.testing.assert_array_equal(gpu.gather_rows(cuda.to_device(table), cuda.to_device(ids))
                                  .copy_to_host(), table[ids])


def test_rope_write_kv(gpu):
    rng = np.random.default_rng(2)
    cos, sin = reference.rope_tables(32, 8, 10000.0)
    q, k, v = rand(rng, 3, 4, 8), rand(rng, 3, 2, 8), rand(rng, 3, 2, 8)
    positions = np.array([5, 0, 31], np.int32)
    slots = np.array([9, 2, 14], np.int32)
    k_pool, v_pool = np.zeros((2, 4, 4, 2, 8), np.float32), np.zeros((2, 4, 4, 2, 8), np.float32)
    want_q = reference.rope_write_kv(q, k, v, positions, cos, sin, k_pool[1], v_pool[1], slots)
    dev_k, dev_v = cuda.to_device(np.zeros_like(k_pool)), cuda.to_device(np.zeros_like(v_pool))
    got_q = gpu.rope_write_kv(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v),
                              cuda.to_device(positions), cuda.to_device(cos), cuda.to_device(sin),
                              dev_k[1], dev_v[1], cuda.to_device(slots))
    np.testing.assert_allclose(got_q.copy_to_host(), want_q, **TOL)
    np.testing.assert_allclose(dev_k.copy_to_host(), k_pool, **TOL)
    np.testing.assert_array_equal(dev_v.copy_to_host(), v_pool)


def _ragged_case(rng, block_size, n_heads, n_kv, head_dim, context_lens, n_new):
    """(metadata, q, K pool, V pool): sequences of context_lens keys, the last n_new of
    each computed this step, their blocks scattered over a 64-block pool."""
    free = list(rng.permutation(64))
    tables = [[int(free.pop()) for _ in range(-(-n // block_size))] for n in context_lens]
    k_cache, v_cache = (rand(rng, 64, block_size, n_kv, head_dim) for _ in range(2))
    meta = AttentionMetadata.build([(t, n - m, n) for t, n, m in zip(tables, context_lens, n_new)],
                                   block_size)
    return meta, rand(rng, meta.num_tokens, n_heads, head_dim), k_cache, v_cache


@pytest.mark.parametrize("window, softcap", [(None, None), (5, None), (18, None), (None, 0.8)])
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("n_heads, n_kv", [(4, 2), (2, 2)])
def test_paged_attention_decode_and_prefill(gpu, block_size, n_heads, n_kv, window, softcap):
    """Ragged block tables, a partial last block, decode rows and prefill tiles mixed
    (the 19-token prefill spans two query tiles on the simulator, one on a GPU, 11 of
    its keys cached); a sliding
    window of 5 (inside one key tile) or 18 (the first query tile's first key in
    another tile than its last query's); scores soft-capped (Gemma 2), scaled by 0.3."""
    rng = np.random.default_rng(block_size + n_heads)
    meta, q, k_cache, v_cache = _ragged_case(rng, block_size, n_heads, n_kv, 8, [5, 30, 17], [1, 19, 1])
    scale = None if softcap is None else 0.3
    want = reference.paged_attention(q, k_cache, v_cache, meta, window, scale, softcap)
    ids, dev_meta = gpu.prepare_inputs(np.zeros(meta.num_tokens, np.int64), meta)
    assert (dev_meta.num_decode, dev_meta.num_tiles) == (2, -(-19 // prefill_attention.Q_TILE))
    got = gpu.paged_attention(cuda.to_device(q), cuda.to_device(k_cache), cuda.to_device(v_cache),
                              dev_meta, window, scale, softcap).copy_to_host()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("head_dim, window, softcap", [(80, None, None), (128, 9, 0.8), (64, None, None)])
def test_prefill_attention_over_wide_heads_and_chunks_after_a_prefix(gpu, head_dim, window, softcap):
    """The prefill kernel built for heads of up to 128 (80 and 128: a key's lanes take
    ten or sixteen dimensions each, the last partly) and for up to 64; two sequences'
    chunks of 21 and 35 rows after 13 and 0 keys in the pool (key tiles that start
    mid-block; a chunk over several query tiles), a GQA group of 3, a window of 9
    (tiles whose keys are all outside it) soft-capped."""
    rng = np.random.default_rng(head_dim)
    meta, q, k_cache, v_cache = _ragged_case(rng, 16, 6, 2, head_dim, [34, 35], [21, 35])
    scale = None if softcap is None else 0.3
    want = reference.paged_attention(q, k_cache, v_cache, meta, window, scale, softcap)
    _, dev_meta = gpu.prepare_inputs(np.zeros(meta.num_tokens, np.int64), meta)
    assert dev_meta.num_decode == 0 and prefill_attention.head_width(head_dim) == (64 if head_dim == 64 else 128)
    got = gpu.paged_attention(cuda.to_device(q), cuda.to_device(k_cache), cuda.to_device(v_cache),
                              dev_meta, window, scale, softcap).copy_to_host()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("head_dim, window, sms, split", [
    (40, None, 2, (2, 256)), (128, None, 2, (2, 256)), (40, 150, 2, (2, 256)), (40, 2, 2, (2, 256)),
    (40, None, 128, (32, 16)), (40, 150, 128, (32, 16))])
def test_split_k_decode_attention_over_long_contexts(gpu, monkeypatch, head_dim, window, sms, split):
    """Contexts of 300, 7 and 129 keys (the grid covers 512) split as decode_split finds
    fastest for a GPU of `sms` SMs (DECODE_BLOCKS_PER_SM blocks each): 2 partitions of
    256 keys (the 300-key row's second short, the others in one, written out
    directly), or 32 of 16 (the 300-key row in
    19, the merge's unrolled loads over more than MERGE_UNROLL partitions), each walked
    in chunks, merged by the last block to arrive (one launch; the arrival counts back
    at zero after it); a GQA group of 3; head_dim 40 leaves a key's 8 threads five
    dimensions each, 128 sixteen. A window of 150 leaves the 300-key row's partitions
    before key 150 out; a window of 2 leaves each row one partition with keys."""
    rng = np.random.default_rng(head_dim + sms)
    n_kv = 2
    meta, q, k_cache, v_cache = _ragged_case(rng, 16, 6, n_kv, head_dim, [300, 7, 129], [1, 1, 1])
    want = reference.paged_attention(q, k_cache, v_cache, meta, window)
    _, dev_meta = gpu.prepare_inputs(np.zeros(meta.num_tokens, np.int64), meta)
    monkeypatch.setattr(gpu.launcher, "sms", sms)
    assert attention.CHUNK == 8 and dev_meta.decode_keys == 512
    assert attention.decode_split(3, n_kv, 3, 512, sms) == split
    before = gpu.launcher.launches
    got = gpu.paged_attention(cuda.to_device(q), cuda.to_device(k_cache), cuda.to_device(v_cache),
                              dev_meta, window).copy_to_host()
    assert gpu.launcher.launches - before == 1  # the split kernel merges its own partitions
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert not gpu.launcher.arrival_counts(3, n_kv).copy_to_host().any()


def test_decode_split_fills_the_gpu_at_batch_1_and_keeps_long_partitions_for_large_batches():
    """On an H200 (132 SMs, 32-key chunks), SmolLM2's 3 KV heads of 3 query heads: one
    row's 128 or 1,024 keys split until the blocks fill the SMs; 64 rows keep long
    partitions (the grid fills the GPU already); a short context is one partition; the
    merge's weights bound the partitions of a wide group."""
    from tinypaged.kernels.cuda.attention import MERGE_WEIGHTS, decode_split

    assert decode_split(1, 3, 3, 128, 132, 32) == (4, 32)
    assert decode_split(1, 3, 3, 1024, 132, 32) == (32, 32)
    assert decode_split(64, 3, 3, 512, 132, 32) == (1, 512)  # (192 blocks: one wave at 2 an SM)
    assert decode_split(1, 3, 3, 32, 132, 32) == (1, 32)
    assert decode_split(1, 3, 3, 16, 132, 32) == (1, 32)  # (fewer keys than a chunk)
    parts, partition = decode_split(1, 1, 32, 1 << 17, 132, 32)
    assert parts * 32 <= MERGE_WEIGHTS and parts * partition == 1 << 17


def test_copy_blocks(gpu):
    rng = np.random.default_rng(3)
    k_pool, v_pool = rand(rng, 2, 5, 4, 2, 3), rand(rng, 2, 5, 4, 2, 3)
    dev_k, dev_v = cuda.to_device(k_pool), cuda.to_device(v_pool)
    gpu.copy_blocks(dev_k, dev_v, [(1, 4), (0, 2)])
    reference.copy_blocks(k_pool, v_pool, [(1, 4), (0, 2)])
    np.testing.assert_array_equal(dev_k.copy_to_host(), k_pool)
    np.testing.assert_array_equal(dev_v.copy_to_host(), v_pool)


def test_metadata_goes_up_in_one_transfer_into_a_reused_buffer(gpu):
    meta = AttentionMetadata.build([([3, 1], 0, 6), ([2], 2, 3)], 4)
    ids, dev = gpu.prepare_inputs(np.arange(7), meta)
    buffer = gpu.uploader.device
    np.testing.assert_array_equal(ids.copy_to_host(), np.arange(7))
    np.testing.assert_array_equal(dev.block_tables.copy_to_host(), meta.block_tables)
    np.testing.assert_array_equal(dev.slot_mapping.copy_to_host(), meta.slot_mapping)
    np.testing.assert_array_equal(dev.decode_rows.copy_to_host(), [6])
    np.testing.assert_array_equal(dev.prefill_tiles.copy_to_host(), [[0, 6]])
    gpu.prepare_inputs(np.arange(2), AttentionMetadata.build([([0], 1, 2)], 4))
    assert gpu.uploader.device is buffer  # no new device allocation for a smaller step


def test_a_float16_pool_rounds_on_write_and_widens_on_read(gpu):
    """kv_cache_dtype="float16" on the device: rope_write_kv rounds K/V into the pool
    as the reference's float16 pool does, bit for bit; decode (split into partitions)
    and prefill attention read it as the reference does."""
    rng = np.random.default_rng(17)
    cos, sin = reference.rope_tables(160, 8, 10000.0)
    meta = AttentionMetadata.build([(list(range(10)), 0, 150), ([20], 0, 5)], 16)
    n = meta.num_tokens
    q, k, v = rand(rng, n, 4, 8), rand(rng, n, 2, 8) * 300, rand(rng, n, 2, 8)
    k_half, v_half = reference.allocate_kv((1, 24, 16, 2, 8), np.float16)
    want_q = reference.rope_write_kv(q, k, v, meta.positions, cos, sin, k_half[0], v_half[0],
                                     meta.slot_mapping)
    gpu.allocate_kv((1, 24, 16, 2, 8), np.float16)
    dev_k, dev_v = gpu.kv_pool[0], gpu.kv_pool[1]
    ids, dev_meta = gpu.prepare_inputs(np.zeros(n, np.int64), meta)
    dev_q = gpu.rope_write_kv(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v),
                              dev_meta.positions, cuda.to_device(cos), cuda.to_device(sin),
                              dev_k[0], dev_v[0], dev_meta.slot_mapping)
    assert dev_k.dtype == np.float16
    slots = meta.slot_mapping  # (the device pool is not zeroed: compare the written slots)
    for dev, want_pool in ((dev_k, k_half), (dev_v, v_half)):
        np.testing.assert_array_equal(dev.copy_to_host().reshape(-1, 2, 8)[slots],
                                      want_pool.reshape(-1, 2, 8)[slots])
    want = reference.paged_attention(want_q / 300, k_half[0], v_half[0], meta)
    # decode: the last token of each sequence, over 150 and 5 keys
    decode = AttentionMetadata.build([(list(range(10)), 149, 150), ([20], 4, 5)], 16)
    _, dev_decode = gpu.prepare_inputs(np.zeros(2, np.int64), decode)
    assert attention.decode_split(2, 2, 2, dev_decode.decode_keys, gpu.launcher.sms) == (4, 64)
    q_last = (want_q / 300)[[149, 154]]
    got = gpu.paged_attention(cuda.to_device(q_last), dev_k[0], dev_v[0], dev_decode)
    np.testing.assert_allclose(got.copy_to_host(), want[[149, 154]], rtol=1e-4, atol=1e-5)
    _, dev_meta = gpu.prepare_inputs(np.zeros(n, np.int64), meta)
    got = gpu.paged_attention(cuda.to_device(want_q / 300), dev_k[0], dev_v[0], dev_meta)
    np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dev_q.copy_to_host(), want_q, **TOL)


@pytest.mark.parametrize("head_dim", [32, 96])  # one block of 32 a row; three (a half-warp idle)
def test_rope_writes_an_int8_pool_as_kv_q8_rows_bit_for_bit(gpu, head_dim):
    """kv_cache_dtype="int8" on the device: rope_write_kv_q8 stores kv_q8.py's rows (the
    values, then the float16 scales' bytes), bit for bit as the reference's int8 pool;
    the rotated q as the float kernel's; a padding row (position -1) writes nothing."""
    rng = np.random.default_rng(head_dim)
    cos, sin = reference.rope_tables(40, head_dim, 10000.0)
    q, k, v = rand(rng, 4, 3, head_dim), rand(rng, 4, 1, head_dim) * 30, rand(rng, 4, 1, head_dim)
    k[1, 0, :32] = 0  # a block of zeros: scale 0, values 0
    positions, slots = np.array([5, 0, 39, -1], np.int32), np.array([9, 2, 14, 3], np.int32)
    k_want, v_want = reference.allocate_kv((1, 4, 4, 1, head_dim), np.int8)
    want_q = reference.rope_write_kv(q[:3], k[:3], v[:3], positions[:3], cos, sin, k_want[0],
                                     v_want[0], slots[:3])
    k_pool, v_pool = gpu.allocate_kv((1, 4, 4, 1, head_dim), np.int8)
    gpu.kv_pool.copy_to_device(np.zeros(gpu.kv_pool.shape, np.int8))
    got_q = gpu.rope_write_kv(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v),
                              cuda.to_device(positions), cuda.to_device(cos), cuda.to_device(sin),
                              k_pool[0], v_pool[0], cuda.to_device(slots))
    np.testing.assert_array_equal(got_q.copy_to_host()[:3], want_q)
    np.testing.assert_array_equal(got_q.copy_to_host()[3], q[3])  # (padding: untouched)
    np.testing.assert_array_equal(k_pool.copy_to_host(), k_want)
    np.testing.assert_array_equal(v_pool.copy_to_host(), v_want)


def test_attention_reads_an_int8_pool_as_the_reference_and_blocks_copy_with_their_scales(gpu):
    """Decode (two partitions) and prefill attention over an int8 pool read its rows as
    reference.kv_values dequantizes them; copy-on-write copies a block's scales with
    its values."""
    rng = np.random.default_rng(23)
    head_dim, shape = 32, (1, 24, 16, 2, 32)
    cos, sin = reference.rope_tables(160, head_dim, 10000.0)
    meta = AttentionMetadata.build([(list(range(10)), 0, 150), ([20], 0, 5)], 16)
    n = meta.num_tokens
    q, k, v = rand(rng, n, 4, head_dim), rand(rng, n, 2, head_dim), rand(rng, n, 2, head_dim)
    k_want, v_want = reference.allocate_kv(shape, np.int8)
    want_q = reference.rope_write_kv(q, k, v, meta.positions, cos, sin, k_want[0], v_want[0],
                                     meta.slot_mapping)
    k_pool, v_pool = gpu.allocate_kv(shape, np.int8)
    gpu.kv_pool.copy_to_device(np.zeros(gpu.kv_pool.shape, np.int8))
    _, dev_meta = gpu.prepare_inputs(np.zeros(n, np.int64), meta)
    gpu.rope_write_kv(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), dev_meta.positions,
                      cuda.to_device(cos), cuda.to_device(sin), k_pool[0], v_pool[0],
                      dev_meta.slot_mapping)
    want = reference.paged_attention(want_q, k_want[0], v_want[0], meta)
    got = gpu.paged_attention(cuda.to_device(want_q), k_pool[0], v_pool[0], dev_meta)
    np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-4, atol=1e-5)
    decode = AttentionMetadata.build([(list(range(10)), 149, 150), ([20], 4, 5)], 16)
    _, dev_decode = gpu.prepare_inputs(np.zeros(2, np.int64), decode)
    assert attention.decode_split(2, 2, 2, dev_decode.decode_keys, gpu.launcher.sms) == (4, 64)
    got = gpu.paged_attention(cuda.to_device(want_q[[149, 154]]), k_pool[0], v_pool[0], dev_decode)
    np.testing.assert_allclose(got.copy_to_host(), want[[149, 154]], rtol=1e-4, atol=1e-5)
    gpu.copy_blocks(k_pool, v_pool, [(20, 23), (3, 21)])
    reference.copy_blocks(k_want, v_want, [(20, 23), (3, 21)])
    np.testing.assert_array_equal(k_pool.copy_to_host(), k_want)
    np.testing.assert_array_equal(v_pool.copy_to_host(), v_want)


def test_with_packed_weights_the_norm_also_writes_its_output_rounded():
    """The norm's rounded output (one warp step per 32-value block, max by shuffles)
    is reference.round_activations of its output, bit for bit, and the packed product
    of a norm's output takes it without a round_activations launch."""
    from tinypaged.formats.quant_kind import Q8_0
    from tinypaged.formats.packed import PackedWeight
    rng = np.random.default_rng(23)
    gpu = CudaBackend(weight_dtype=np.float32)
    dev = gpu.prepare_weights({"w": PackedWeight.quantize(rand(rng, 8, 96), Q8_0)})
    x, residual, weight = rand(rng, 3, 96), rand(rng, 3, 96), rand(rng, 96)
    x[1, 32:64] = 0.0  # a block of zeros: d = 0
    dev_residual = cuda.to_device(residual)
    out, _ = gpu.add_rms_norm(cuda.to_device(x), dev_residual, cuda.to_device(weight), 1e-5)
    want, _ = reference.add_rms_norm(x, residual, weight, 1e-5)
    np.testing.assert_allclose(out.copy_to_host(), want, **TOL)
    before = gpu.launcher.launches
    rounded = gpu._input_for(out, dev["w"])
    assert gpu.launcher.launches == before  # no rounding launch: the norm wrote it
    np.testing.assert_array_equal(rounded.copy_to_host(),
                                  reference.round_activations(out.copy_to_host()))
    other = cuda.to_device(out.copy_to_host())  # not a norm's output: rounded by a launch
    np.testing.assert_array_equal(gpu._input_for(other, dev["w"]).copy_to_host(),
                                  rounded.copy_to_host())
    assert gpu.launcher.launches == before + 1


# -- the logits' way back (issue 18, B7) --------------------------------------------------------

@pytest.mark.parametrize("k", [1, 4])
def test_top_candidates_are_numpys_order_ties_and_infinities_included(gpu, k):
    """top_candidates: each row's k most likely (value, id), by value descending then
    id ascending, np.argmax's rule, over rows picked by index."""
    from tinypaged.kernels.cuda.logits import TOP_THREADS, top_candidates

    rng = np.random.default_rng(k)
    logits = rand(rng, 5, 700)
    logits[1, [3, 400, 699]] = 9.0  # a three-way tie at the top
    logits[2] = -np.inf
    logits[2, 650] = 1.0  # one finite value, the rest -inf
    logits[3, :5] = np.float32(7.5)  # ties among the first ids
    rows = [4, 1, 2, 3]
    out = cuda.device_array((len(rows), k, 2), np.float32)
    top_candidates[len(rows), TOP_THREADS](cuda.to_device(logits),
                                          cuda.to_device(np.array(rows, np.int32)), k, out)
    got = out.copy_to_host()
    for b, r in enumerate(rows):
        order = np.lexsort((np.arange(700), -logits[r]))[:k]  # value desc, then id asc
        np.testing.assert_array_equal(got[b, :, 1], order.astype(np.float32), err_msg=f"row {r}")
        np.testing.assert_array_equal(got[b, :, 0], logits[r, order])
    assert got[0, 0, 1] == np.argmax(logits[4])

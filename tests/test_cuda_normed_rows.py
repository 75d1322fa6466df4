"""A block's input norm folded into the float GEMVs after it (normed_rows.py,
matmul.NORMED_GEMVS): the products, the stream's new sum and the rows themselves
against the NumPy reference, and the launches it saves or owes."""
import numpy as np
import pytest
from numba import cuda

from tinypaged.formats.packed import PackedWeight
from tinypaged.formats.quant_kind import Q8_0
from tinypaged.kernels import reference
from tinypaged.kernels.cuda import matmul
from tinypaged.kernels.cuda.backend import CudaBackend
from tinypaged.kernels.cuda.device_weights import DeviceFloat
from tinypaged.kernels.cuda.normed_rows import NormedRows
from tinypaged.kernels.cuda.step_recording import StepRecording

pytestmark = pytest.mark.cuda
TOL = dict(rtol=2e-5, atol=2e-5)
EPS = 1e-5


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _stream(rng, rows, width=40):
    """x, the residual and the norm's weight; up to the device (x, residual, weight)."""
    x, residual, weight = rand(rng, rows, width), rand(rng, rows, width), rand(rng, width)
    return (x, residual, weight), tuple(cuda.to_device(a) for a in (x, residual, weight))


@pytest.mark.parametrize("rows, width", [(1, 40), (matmul.NORMED_MAX_ROWS, 40), (2, 300)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_the_norm_folds_into_each_product_that_takes_it(rows, width, with_residual):
    """q|k|v (with biases), gate/up + SiLU and a lone product, each one launch that
    does the norm itself; the stream's sum written by the first; the rows written by
    one norm launch only when asked for, then taken as they are. (300 wide: a thread's
    steps along a row, the last partly, on the simulator's one warp a row.)"""
    rng = np.random.default_rng(rows + 10 * with_residual)
    gpu = CudaBackend()
    (x, residual, weight), (dx, dr, dw) = _stream(rng, rows, width)
    if not with_residual:
        residual, dr = None, None
    h_want, sum_want = reference.add_rms_norm(x, residual, weight, EPS)
    wq, wk, wv, wg, wu, wo = (rand(rng, n, width).astype(np.float16) for n in (24, 8, 8, 12, 12, 9))
    biases = [rand(rng, n) for n in (24, 8, 8)]
    launches = gpu.launcher.launches
    h, new_sum = gpu.norm_for_products(dx, dr, dw, EPS)
    assert isinstance(h, NormedRows) and len(h) == rows and gpu.launcher.launches == launches

    q, k, v = gpu.qkv_proj(h, *(DeviceFloat(w, np.float16) for w in (wq, wk, wv)),
                           *(cuda.to_device(b) for b in biases))
    assert gpu.launcher.launches == launches + 1
    for got, want in zip((q, k, v), reference.qkv_proj(h_want, wq.astype(np.float32), wk.astype(np.float32),
                                                       wv.astype(np.float32), *biases)):
        np.testing.assert_allclose(got.copy_to_host(), want, **TOL)
    np.testing.assert_allclose(new_sum.copy_to_host(), sum_want, **TOL)  # (x itself without a residual)
    if residual is None:
        assert new_sum is dx

    act = gpu.gate_up_silu(h, DeviceFloat(wg, np.float16), DeviceFloat(wu, np.float16))
    out = gpu.linear(h, DeviceFloat(wo, np.float16))
    assert gpu.launcher.launches == launches + 3 and not h.written
    np.testing.assert_allclose(act.copy_to_host(), reference.gate_up_silu(
        h_want, wg.astype(np.float32), wu.astype(np.float32)), **TOL)
    np.testing.assert_allclose(out.copy_to_host(), reference.linear(h_want, wo.astype(np.float32)), **TOL)

    np.testing.assert_allclose(gpu.to_host(h), h_want, **TOL)  # the rows: one norm launch
    assert h.written and gpu.launcher.launches == launches + 4
    again = gpu.linear(h, DeviceFloat(wo, np.float16)).copy_to_host()  # (the rows, a plain GEMV)
    assert gpu.launcher.launches == launches + 5
    np.testing.assert_allclose(again, out.copy_to_host(), **TOL)


def test_an_owed_norm_runs_before_any_other_launch_and_ends_a_recording():
    """Until a product folds it, the stream's new sum is not written: any other launch,
    or a copy back, runs the norm first; a recording that ends owing it records it."""
    rng = np.random.default_rng(3)
    gpu = CudaBackend()
    (x, residual, weight), (dx, dr, dw) = _stream(rng, 2)
    h_want, sum_want = reference.add_rms_norm(x, residual, weight, EPS)
    h, new_sum = gpu.norm_for_products(dx, dr, dw, EPS)
    launches = gpu.launcher.launches
    rows = gpu.gather_rows(new_sum, cuda.to_device(np.array([1, 0], np.int32)))
    assert gpu.launcher.launches == launches + 2 and h.written  # the norm, then the gather
    np.testing.assert_allclose(rows.copy_to_host(), sum_want[[1, 0]], **TOL)
    np.testing.assert_allclose(gpu.to_host(h), h_want, **TOL)
    assert gpu.launcher.launches == launches + 2  # (written already)

    h, new_sum = gpu.norm_for_products(dx, dr, dw, EPS)
    np.testing.assert_allclose(gpu.to_host(new_sum), sum_want, **TOL)  # a copy back settles it too

    recording = StepRecording()
    with gpu.recording(recording):
        h, new_sum = gpu.norm_for_products(dx, dr, dw, EPS)
    assert len(recording) == 1 and h.written
    np.testing.assert_allclose(new_sum.copy_to_host(), sum_want, **TOL)


def test_more_rows_or_packed_matrices_take_the_norm_as_a_launch_of_its_own():
    """Past NORMED_MAX_ROWS rows, or with packed matrices (their products take x
    rounded, which the norm writes), the norm launches at once and gives arrays."""
    rng = np.random.default_rng(4)
    (x, residual, weight), (dx, dr, dw) = _stream(rng, matmul.NORMED_MAX_ROWS + 1)
    h_want, sum_want = reference.add_rms_norm(x, residual, weight, EPS)
    gpu = CudaBackend()
    launches = gpu.launcher.launches
    h, new_sum = gpu.norm_for_products(dx, dr, dw, EPS)
    assert not isinstance(h, NormedRows) and gpu.launcher.launches == launches + 1
    np.testing.assert_allclose(h.copy_to_host(), h_want, **TOL)
    np.testing.assert_allclose(new_sum.copy_to_host(), sum_want, **TOL)

    packed = CudaBackend(weight_dtype=np.float32)
    packed.prepare_weights({"w": PackedWeight.quantize(rand(rng, 8, 64), Q8_0)})
    (x, residual, weight), (dx, dr, dw) = _stream(rng, 1, width=64)
    h, _ = packed.norm_for_products(dx, dr, dw, EPS)
    assert not isinstance(h, NormedRows)
    np.testing.assert_allclose(h.copy_to_host(), reference.add_rms_norm(x, residual, weight, EPS)[0], **TOL)

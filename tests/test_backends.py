"""Every backend exposes the whole op interface (kernels/__init__.OP_NAMES)."""
import pytest

from tinypaged.kernels import OP_NAMES, cpu, get_backend, reference
from tinypaged.kernels.cuda.backend import CudaBackend


@pytest.mark.parametrize("backend", [reference, cpu, CudaBackend], ids=["reference", "cpu", "cuda"])
def test_backend_has_every_op(backend):
    missing = [op for op in OP_NAMES if not callable(getattr(backend, op, None))]
    assert not missing
    assert backend.name == {reference: "reference", cpu: "cpu", CudaBackend: "cuda"}[backend]


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="backend='tpu' is not one of"):
        get_backend("tpu")

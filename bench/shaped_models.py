"""Random-weight GGUF files in the real shapes of the models users run, written the way
users get theirs: HF transformers builds the model from its real config.json (random
weights, seeded), llama.cpp's own converter writes the GGUF, and `llama-quantize`
makes Q4_K_M and Q8_0 of it. Both engines then read the same bytes.

The weights are random, so the text is noise; the shapes, the quant kinds per tensor
(a tied Q4_K_M embedding is Q6_K, as in the downloads) and the bytes a step moves are
the real ones. The tokenizer is SmolLM2's (the converter knows its pre-tokenizer);
the converter pads its vocabulary to the config's with unused tokens, so the
embedding and lm_head have the real 128,256 or 151,936 rows.

Needs a separate environment (never the project's): torch + transformers, the
converter's own gguf-py, and a built llama.cpp (bench/NOTES.md: the peer's build).

Usage:
  python bench/shaped_models.py --llama-cpp DIR [--out weights/shaped] [--shapes llama-3.2-1b,qwen3-0.6b,llama-3.2-3b]
DIR is llama.cpp's source folder (convert_hf_to_gguf.py) with its build/bin.
Writes OUT/<shape>.Q4_K_M.gguf and OUT/<shape>.Q8_0.gguf; skips files already there.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_FROM = ROOT / "weights" / "smollm2-135m-instruct"  # `cli.py pull` writes it

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# the config.json of each model as published (the fields that set shapes and math)
SHAPES = {
    "llama-3.2-1b": {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                     "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
                     "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                     "rope_theta": 500000.0, "rope_scaling": LLAMA3_ROPE, "tie_word_embeddings": True},
    "llama-3.2-3b": {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                     "vocab_size": 128256, "hidden_size": 3072, "intermediate_size": 8192,
                     "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
                     "head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                     "rope_theta": 500000.0, "rope_scaling": LLAMA3_ROPE, "tie_word_embeddings": True},
    "qwen3-0.6b": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                   "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
                   "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
                   "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
                   "rope_theta": 1000000.0, "tie_word_embeddings": True, "attention_bias": False},
    "qwen3-1.7b": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                   "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
                   "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
                   "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
                   "rope_theta": 1000000.0, "tie_word_embeddings": True, "attention_bias": False},
}
KINDS = ("Q4_K_M", "Q8_0")


def hf_folder(shape: str, folder: Path) -> None:
    """A HF folder: the shape's config, seeded random weights (float16), SmolLM2's tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = dict(SHAPES[shape], bos_token_id=1, eos_token_id=2, torch_dtype="float16")
    (folder / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.float16)
    model.save_pretrained(folder)
    shutil.copy(TOKENIZER_FROM / "tokenizer.json", folder / "tokenizer.json")
    # tokenizer.json as it is, whatever the model type (Qwen's own tokenizer class would
    # swap the pre-tokenizer, and the converter would not recognise it)
    tokenizer_config = json.loads((TOKENIZER_FROM / "tokenizer_config.json").read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))


def run(cmd: list) -> None:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{Path(str(cmd[1] if cmd[0] == sys.executable else cmd[0])).name} failed:\n"
                 f"{done.stderr[-2000:]}")


def make(shape: str, llama_cpp: Path, out: Path) -> None:
    targets = {kind: out / f"{shape}.{kind}.gguf" for kind in KINDS}
    if all(t.is_file() for t in targets.values()):
        print(f"{shape}: there already")
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=out) as scratch:
        folder, f16 = Path(scratch) / shape, Path(scratch) / f"{shape}.F16.gguf"
        folder.mkdir()
        hf_folder(shape, folder)
        run([sys.executable, llama_cpp / "convert_hf_to_gguf.py", folder, "--outtype", "f16",
             "--outfile", f16])
        for kind, target in targets.items():
            run([llama_cpp / "build" / "bin" / "llama-quantize", f16, target, kind, "2"])
    sizes = ", ".join(f"{k} {t.stat().st_size / 2**20:.0f} MiB" for k, t in targets.items())
    print(f"{shape}: {sizes} ({time.perf_counter() - started:.0f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-cpp", required=True, type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "weights" / "shaped")
    parser.add_argument("--shapes", default="llama-3.2-1b,qwen3-0.6b,llama-3.2-3b")
    args = parser.parse_args()
    if not (TOKENIZER_FROM / "tokenizer.json").is_file():
        sys.exit(f"no {TOKENIZER_FROM}: run `python cli.py pull` first")
    args.out.mkdir(parents=True, exist_ok=True)
    for shape in args.shapes.split(","):
        if shape not in SHAPES:
            sys.exit(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
        make(shape, args.llama_cpp, args.out)


if __name__ == "__main__":
    main()

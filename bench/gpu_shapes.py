"""The models users run, on the card (issue 45, part 5): a model of Llama-3.2-1B's
published shapes with random float16 weights (speed does not depend on the values;
the weights cannot travel, so they are made there), decoded at batch 1 and 64 as
replayed steps beside the step model; and one of its layers' products with the
packed kinds a Q4_K_M file holds (Q4_K; Q6_K for v and down), random blocks, at
batch 1 (GEMVs) and 64 (tiled), beside the float16 ones. gpu_check.py calls these.
"""
import json
import os
import shutil
import sys
import time

import numpy as np
from numba import cuda

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # random_blocks: K-quant blocks as files hold them

from calibration import decode_tokens_per_s, modeled  # noqa: E402
from shaped_models import SHAPES  # noqa: E402

# --tiny (the simulator): a small model, and products whose rows K-quants can hold (256)
TINY_MODEL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=512)
TINY_PRODUCTS = dict(hidden_size=256, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
                     num_key_value_heads=1, head_dim=64)


def random_model_like(config_dir, out_dir, config=None):
    """A folder with config_dir's tokenizer files, its config (or `config`) and random
    float16 weights of those shapes."""
    from safetensors.numpy import save_file

    from tinypaged.model.config import ModelConfig
    from tinypaged.model.weights import expected_shapes
    os.makedirs(out_dir, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(config_dir, name), out_dir)
    if config is None:
        shutil.copy(os.path.join(config_dir, "config.json"), out_dir)
    else:
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(config, f)
    rng = np.random.default_rng(0)
    cfg = ModelConfig.from_json(out_dir)
    weights = {}
    for name, shape in expected_shapes(cfg).items():
        values = rng.standard_normal(shape, dtype=np.float32)
        values *= np.float32(1 / np.sqrt(shape[-1]))
        weights[name] = values.astype(np.float16)
    save_file(weights, os.path.join(out_dir, "model.safetensors"))
    return out_dir


def decode_rate(engine, prompts, params) -> float:
    """Decode tokens/s of `prompts` run together to the end: after their prompts (in
    chunks, until each has its first token) and the first decode step (recorded in
    graph mode), the rest of the steps timed."""
    for prompt in prompts:
        engine.add_request(prompt, params)
    started = set()
    while len(started) < len(prompts):
        started.update(o.request_id for o in engine.step() if o.outputs)
    engine.step()
    tokens, begin = 0, time.perf_counter()
    while engine.has_unfinished():
        tokens += sum(len(o.outputs) for o in engine.step())
    cuda.synchronize()
    return tokens / (time.perf_counter() - begin)


def llama_1b_decode(report, tokenizer_dir, tiny=False):
    """Batch 1 and 64 graph-mode decode tokens/s of the Llama-3.2-1B-shaped model (a
    prompt of ~40 tokens each, 64 decoded), beside decode_step's prediction."""
    from tinypaged import LLM, SamplingParams
    config = dict(SHAPES["llama-3.2-1b"], bos_token_id=1, eos_token_id=2, torch_dtype="float16")
    if tiny:
        config.update(TINY_MODEL)
    start = time.perf_counter()
    folder = random_model_like(tokenizer_dir, "/tmp/tinypaged-llama-1b-shape", config)
    print(f"(the 1B-shaped folder written in {time.perf_counter() - start:.0f} s)", flush=True)
    llm = LLM(folder, backend="cuda", cuda_graphs=True, kv_cache_memory=(64 << 20) if tiny else (16 << 30))
    engine, n = llm.engine, (3 if tiny else 64)
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    llm.generate(["warm up"] * 2, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    for batch in ((1, 2) if tiny else (1, 64)):
        rate = decode_rate(engine, [f"Write a story about a lighthouse keeper and a storm, number {i}."
                                    for i in range(batch)], params)
        bar = {1: "400 (float16)", 64: "4,000"}.get(batch, "none")
        name = f"Llama-3.2-1B shapes, float16, decode batch {batch}, graph"
        report(name, rate, "tokens/s", f"the issue's bar: {bar} tokens/s",
               predicted=modeled(name, decode_tokens_per_s(engine.model_config, batch, 48)))
    llm.close()


def packed_layer_products(report, device_seconds, tiny=False):
    """Device microseconds of one Llama-3.2-1B layer's products at batch 1 and 64 with
    float16 matrices and with Q4_K_M's kinds (random blocks), and the products of a
    whole step (x 16 layers) as a share of the float16 ones."""
    from random_blocks import random_k_quant

    from tinypaged.formats import quant_kind
    from tinypaged.formats.packed import PackedWeight
    from tinypaged.kernels.cuda.backend import CudaBackend
    shape = dict(SHAPES["llama-3.2-1b"], **(TINY_PRODUCTS if tiny else {}))
    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    q, kv = shape["num_attention_heads"] * shape["head_dim"], shape["num_key_value_heads"] * shape["head_dim"]
    rows = {"q": (q, hidden), "k": (kv, hidden), "v": (kv, hidden), "o": (hidden, q),
            "g": (inter, hidden), "u": (inter, hidden), "d": (hidden, inter)}
    kinds = {"v": "Q6_K", "d": "Q6_K"}  # (Q4_K_M's: Q6_K for the tensors it keeps wider)
    rng = np.random.default_rng(45)
    packed = {name: PackedWeight.from_bytes(random_k_quant(rng, kinds.get(name, "Q4_K"), n, k),
                                            getattr(quant_kind, kinds.get(name, "Q4_K")), (n, k))
              for name, (n, k) in rows.items()}
    floats = {name: (rng.standard_normal((n, k), dtype=np.float32) / 8).astype(np.float16)
              for name, (n, k) in rows.items()}
    layers = shape["num_hidden_layers"]
    for batch in ((1, 9) if tiny else (1, 64)):
        per_form = {}
        forms = (("float16", floats), ("Q4_K_M", packed))
        if tiny and batch > 1:  # (the simulator reads K-quants slowly: test_cuda_kernels holds them)
            forms = forms[:1]
        for form, matrices in forms:
            gpu = CudaBackend()
            w = gpu.prepare_weights(dict(matrices))
            x = cuda.to_device(rng.standard_normal((batch, hidden), dtype=np.float32))
            x_wide = cuda.to_device(rng.standard_normal((batch, inter), dtype=np.float32))
            x_q = cuda.to_device(rng.standard_normal((batch, q), dtype=np.float32))

            def layer():
                gpu.qkv_proj(x, w["q"], w["k"], w["v"])
                gpu.linear(x_q, w["o"])
                gpu.gate_up_silu(x, w["g"], w["u"])
                gpu.linear(x_wide, w["d"])
            seconds, launches = device_seconds(gpu, layer)
            per_form[form] = seconds
            weight_bytes = sum(int(m.nbytes) for m in matrices.values())
            report(f"Llama-3.2-1B layer's products, {form}, batch {batch}", seconds * 1e6, "us",
                   f"{launches} launches; {weight_bytes / seconds / 1e9:.0f} GB/s of weights; "
                   f"x{layers} layers = {layers * seconds * 1e3:.2f} ms a step")
        if "Q4_K_M" in per_form:
            report(f"  Q4_K_M / float16 products, batch {batch}", per_form["Q4_K_M"] / per_form["float16"],
                   "x", "a step's products with packed weights against float16's")

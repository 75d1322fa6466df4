"""GPU check, for a machine with an NVIDIA GPU (made for an H200, no network).

Runs the `cuda` tests for real, then prints one table: the card's copy bandwidth
measured here; paged-attention decode at batch 64 x 1024-token contexts (GB/s and
fraction of that bandwidth); matmul GFLOP/s for SmolLM2's decode and prefill
shapes; end-to-end SmolLM2 decode tokens/s at batch 1 and 64 with kernel launches
per step. Usage: python bench/gpu_check.py [--skip-tests] [--model DIR]
Needs numpy, numba, numba-cuda, safetensors, tokenizers, pytest (the machine's image
has them); the model folder travels with the working tree or is pulled beforehand.
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from numba import cuda  # noqa: E402

from tinypaged.engine.attention_metadata import AttentionMetadata  # noqa: E402
from tinypaged.kernels.cuda.backend import CudaBackend  # noqa: E402

ROWS = []
TINY = False  # --tiny: small shapes, to rehearse this script on the CUDA simulator


def report(name, value, unit, note=""):
    ROWS.append((name, value, unit, note))
    print(f"{name:<48} {value:>12.2f} {unit:<10} {note}", flush=True)


def timed(fn, repeat=20):
    """Seconds per call on the device (CUDA events), after two warm-up calls."""
    fn()
    fn()
    cuda.synchronize()
    start, end = cuda.event(), cuda.event()
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeat


def copy_bandwidth():
    n = 1 << (12 if TINY else 28)  # 1 GiB of float32
    src, dst = cuda.device_array(n, np.float32), cuda.device_array(n, np.float32)
    seconds = timed(lambda: dst.copy_to_device(src), repeat=10)
    gbps = 2 * n * 4 / seconds / 1e9  # read + write
    report("device copy bandwidth (read + write)", gbps, "GB/s")
    return gbps


def attention_decode(copy_gbps):
    gpu = CudaBackend()
    batch, ctx, bs, n_heads, n_kv, d = 64, 1024, 16, 9, 3, 64  # SmolLM2's attention shape
    if TINY:
        batch, ctx = 2, 32
    blocks_per_seq = ctx // bs
    n_blocks = batch * blocks_per_seq
    rng = np.random.default_rng(0)
    k = cuda.to_device(rng.standard_normal((n_blocks, bs, n_kv, d), dtype=np.float32))
    v = cuda.to_device(rng.standard_normal((n_blocks, bs, n_kv, d), dtype=np.float32))
    perm = rng.permutation(n_blocks)
    tables = [list(perm[i * blocks_per_seq:(i + 1) * blocks_per_seq]) for i in range(batch)]
    meta = AttentionMetadata.build([(t, ctx - 1, ctx) for t in tables], bs)
    _, dev_meta = gpu.prepare_inputs(np.zeros(batch, np.int64), meta)
    q = cuda.to_device(rng.standard_normal((batch, n_heads, d), dtype=np.float32))
    seconds = timed(lambda: gpu.paged_attention(q, k, v, dev_meta))
    unique = 2 * batch * ctx * n_kv * d * 4  # every K and V element of the batch's contexts
    gbps = unique / seconds / 1e9
    report(f"paged attention decode, {batch} x {ctx} ctx", gbps, "GB/s",
           f"{gbps / copy_gbps:.0%} of copy bandwidth; {seconds * 1e6:.0f} us")


def matmuls():
    gpu = CudaBackend()
    rng = np.random.default_rng(1)
    shapes = ((576, 576), (1536, 576), (576, 1536), (49152, 576))
    for rows in ((1, 9) if TINY else (1, 64, 512)):
        for n_out, width in (((8, 16),) if TINY else shapes):
            w = cuda.to_device(rng.standard_normal((n_out, width)).astype(np.float16))
            x = cuda.to_device(rng.standard_normal((rows, width), dtype=np.float32))

            def run():
                gpu.workspace.reset()
                gpu.linear(x, w)
            seconds = timed(run)
            gflops = 2 * rows * n_out * width / seconds / 1e9
            weight_gbps = n_out * width * 2 / seconds / 1e9
            report(f"linear M={rows} {width}->{n_out} (f16 W)", gflops, "GFLOP/s",
                   f"{weight_gbps:.0f} GB/s of weights")


def random_model_like(config_dir, out_dir):
    """A folder with config_dir's config and tokenizer files and random float16 weights of
    the same shapes: decode speed does not depend on the values, and SmolLM2's 270 MB of
    weights cannot travel to a machine without network (the carry limit is 64 MiB)."""
    import shutil

    from safetensors.numpy import save_file

    from tinypaged.model.config import ModelConfig
    from tinypaged.model.weights import expected_shapes
    os.makedirs(out_dir, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(config_dir, name), out_dir)
    rng = np.random.default_rng(0)
    cfg = ModelConfig.from_json(config_dir)
    weights = {name: (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])).astype(np.float16)
               for name, shape in expected_shapes(cfg).items()}
    save_file(weights, os.path.join(out_dir, "model.safetensors"))
    return out_dir


def end_to_end(model_dir):
    from tinypaged import LLM, SamplingParams
    llm = LLM(model_dir, backend="cuda", kv_cache_memory=(64 << 20) if TINY else (8 << 30))
    ops = llm.engine.runner.model.ops
    params = SamplingParams(temperature=0, max_tokens=4 if TINY else 64, ignore_eos=True)
    llm.generate(["warm up"] * 2, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    n_layers = llm.config.num_hidden_layers
    for batch in ((1, 2) if TINY else (1, 64)):
        engine = llm.engine
        for i in range(batch):
            engine.add_request(f"Write a story about a lighthouse, number {i}.", params)
        engine.step()  # prefill
        steps, tokens, launches = 0, 0, ops.launches
        start = time.perf_counter()
        while engine.has_unfinished():
            tokens += sum(len(o.outputs) for o in engine.step())
            steps += 1
        cuda.synchronize()
        rate = tokens / (time.perf_counter() - start)
        per_step = (ops.launches - launches) / steps
        report(f"model decode, batch {batch}", rate, "tokens/s",
               f"{per_step:.0f} launches/step ({per_step / n_layers:.1f} per layer)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--model", default=os.path.join(ROOT, "weights", "smollm2-135m-instruct"))
    ap.add_argument("--shape-only", metavar="CONFIG_DIR",
                    help="time a model of CONFIG_DIR's shapes with random weights instead")
    ap.add_argument("--tiny", action="store_true",
                    help="small shapes: rehearse the script (NUMBA_ENABLE_CUDASIM=1 works)")
    args = ap.parse_args()
    global TINY
    TINY = args.tiny
    name = getattr(cuda.get_current_device(), "name", "CUDA simulator")
    print(f"device: {name.decode() if isinstance(name, bytes) else name}", flush=True)
    if TINY:
        args.skip_tests = True
    if not args.skip_tests:
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-x",
                                os.path.join(ROOT, "tests")], cwd=ROOT)
        print(f"cuda tests exit status: {tests.returncode}", flush=True)
    copy_gbps = copy_bandwidth()
    attention_decode(copy_gbps)
    matmuls()
    if args.shape_only:
        end_to_end(random_model_like(args.shape_only, "/tmp/tinypaged-shape-model"))
    elif os.path.isdir(args.model):
        end_to_end(args.model)
    else:
        print(f"(no model at {args.model}: end-to-end rows skipped)")
    print("\n| figure | value | unit | note |\n|---|---|---|---|")
    for name, value, unit, note in ROWS:
        print(f"| {name} | {value:.2f} | {unit} | {note} |")


if __name__ == "__main__":
    main()

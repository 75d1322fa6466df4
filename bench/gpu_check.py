"""GPU check, for a machine with an NVIDIA GPU (made for an H200, no network).

Starts with a preflight (versions, NVVM, one kernel, one two-node CUDA graph: it
stops with one line naming what failed), prints one table of measurements, then
runs the CUDA tests for real (cuda_test_command; under a time limit, so that a hang
cannot eat the machine's minutes). Each timed row stands beside a predicted one
(bytes / measured copy bandwidth + launches x measured launch cost):
- the card's copy bandwidth, a Python kernel launch's host cost, a CUDA graph
  node's device cost and a dependent global load (HBM, L2, L1), all measured here; at the
  end, every figure the step model predicts predicted again with these (calibration.py);
- paged-attention decode at 64 x 1024 and 1 x 8192 tokens (GB/s, share of copy
  bandwidth);
- the decode GEMVs and prefill matmuls on SmolLM2's shapes (GB/s of weights), and
  lm_head's GEMV two rows a block against a row a block;
- end-to-end SmolLM2 decode tokens/s at batch 1, 8 and 64, eager and as replayed
  CUDA graphs, with launches per step; batch 1 at 128 and 1,024 keys, batch 64 at
  512, a 2,048-token prompt's prefill, each beside the step model's prediction, and
  the recorded step's kernels one by one beside the model's table;
- a Llama-3.2-1B-shaped model at batch 1 and 64, and its layer's products float16
  and with Q4_K_M's kinds (gpu_shapes.py).
Usage: python bench/gpu_check.py [--skip-tests] [--test-timeout S] [--model DIR | --shape-only DIR] [--tiny]
On the lent H200 (no network; 64 MiB carried): carry SmolLM2's config.json,
tokenizer.json and tokenizer_config.json (weights/smollm2-135m-instruct/...) and run
`--shape-only weights/smollm2-135m-instruct`: random weights of SmolLM2's shapes.
Needs numpy, numba, numba-cuda, safetensors, tokenizers and pytest (the machine's
image has them; pytest-xdist, carried, runs the tests in parallel); the CUDA test
files it runs import nothing else. The model
folder travels with the working tree or is pulled beforehand. Budget: under 8
minutes on an H200, tests included. CI rehearses it on the simulator (--tiny).
"""
import argparse
import importlib.util
import os
import subprocess
import sys
import time
import warnings

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from numba import cuda  # noqa: E402

from tinypaged.batch.attention_metadata import AttentionMetadata  # noqa: E402
from tinypaged.kernels.cuda.attention import decode_split  # noqa: E402
from tinypaged.kernels.cuda.backend import CudaBackend  # noqa: E402
from tinypaged.kernels.cuda.device_weights import DeviceFloat  # noqa: E402
from tinypaged.kernels.kv_q8 import quantize_rows  # noqa: E402
from tinypaged.pull import is_model_folder  # noqa: E402

from calibration import decode_tokens_per_s, modeled, print_recalibrated, round_trips  # noqa: E402
from gpu_shapes import decode_rate, llama_1b_decode, packed_layer_products, random_model_like  # noqa: E402
from verification_cost import verification_costs  # noqa: E402  (bench/, the script's folder)

ROWS = []
TINY = False  # --tiny: small shapes, to rehearse this script on the CUDA simulator


COSTS = {}  # measured: copy GB/s, host seconds a launch, device seconds a graph node


def report(name, value, unit, note="", predicted=None):
    """One row: the measured value, and the predicted one where there is a model."""
    ROWS.append((name, value, unit, note, predicted))
    guess = f"{predicted:>12.2f}" if predicted is not None else " " * 12
    print(f"{name:<48} {value:>12.2f} {guess} {unit:<10} {note}", flush=True)


def predicted_seconds(n_bytes: float, launches: int = 1, graph_nodes: int = 0) -> float:
    """bytes / copy bandwidth + launches x host launch cost + nodes x graph node cost."""
    return (n_bytes / (COSTS["copy_gbps"] * 1e9) + launches * COSTS["launch_s"]
            + graph_nodes * COSTS.get("node_s", 0.0))


def timed(fn, repeat=20):
    """Seconds per call on the device (CUDA events), after two warm-up calls (a --tiny
    rehearsal, whose figures mean nothing, makes one call: the simulator is slow)."""
    if TINY:
        repeat = 1
    else:
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


@cuda.jit
def _add_one(a):
    """a[i] += 1: the preflight's kernel."""
    i = cuda.grid(1)
    if i < a.shape[0]:
        a[i] += 1


def preflight(simulated: bool) -> None:
    """Versions, the driver and NVVM; one kernel compiled and launched; a two-node
    CUDA graph captured and replayed. Stops with one line naming what failed: with
    no kernel or no graph, the rows below would measure nothing meant."""
    from numba.cuda.cudadrv import driver

    from tinypaged.kernels.cuda.step_recording import StepRecording
    from tinypaged.kernels.cuda.toolkit import (check_numba_cuda_imports, find_nvvm,
                                                installed_versions, untested)
    versions = installed_versions()
    print("preflight: " + ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)
    for line in untested(versions):
        print(f"preflight: WARNING {line}", flush=True)
    if simulated:
        print("preflight: the CUDA simulator (no driver, no graphs)", flush=True)
    else:
        device = cuda.get_current_device()
        print(f"preflight: driver CUDA {driver.driver.get_version()}, compute capability "
              f"{device.compute_capability}, CUDA_HOME={os.environ.get('CUDA_HOME')}", flush=True)
    step = "NVVM"
    try:
        try:
            path, how = find_nvvm()
            print(f"preflight: NVVM {path} (found via {how})", flush=True)
        except Exception:  # the simulator compiles nothing
            if not simulated:
                raise
        step = "numba-cuda's NumPy typing"
        check_numba_cuda_imports()
        step = "compiling and launching a kernel"
        a = cuda.to_device(np.arange(64, dtype=np.float32))
        _add_one[2, 32](a)
        if not np.array_equal(a.copy_to_host(), np.arange(64) + 1):
            raise RuntimeError("the kernel ran but wrote wrong values")
        print("preflight: a kernel compiled and ran", flush=True)
        if simulated:
            return
        step = "capturing a CUDA graph"
        recording = StepRecording()
        recording.add(_add_one, 2, 32, (a,))
        recording.add(_add_one, 2, 32, (a,))
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            captured = recording.capture_graph()
        if not captured:  # capture_graph warns why
            raise RuntimeError(next(str(w.message) for w in warned
                                    if issubclass(w.category, RuntimeWarning)))
        step = "replaying a CUDA graph"
        recording.launch()
        cuda.synchronize()
        if not np.array_equal(a.copy_to_host(), np.arange(64) + 3):
            raise RuntimeError("the graph ran but its two nodes did not both add")
        print("preflight: a two-node CUDA graph captured and replayed", flush=True)
    except Exception as e:  # noqa: BLE001 - report and stop
        print(f"preflight failed at {step}: {e!r}", flush=True)
        sys.exit(2)


def replay_seconds(launches, workspace=None, repeat=20):
    """Device seconds of one pass over `launches` ((kernel, grid, block, args) each):
    captured `repeat` times over into one CUDA graph and replayed, so that no Python
    launch gap is counted (a launch from Python costs more than most kernels run). A
    --tiny rehearsal records one pass: its figures mean nothing, the path is the same."""
    from tinypaged.kernels.cuda.step_recording import StepRecording
    many = StepRecording(workspace)
    repeat = 1 if TINY else repeat
    for _ in range(repeat):
        for launch in launches:
            many.add(*launch)
    if not TINY:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (numba's occupancy warnings)
            many.capture_graph()
    return timed(many.launch, repeat=3) / repeat


def device_seconds(gpu, fn):
    """(device seconds a call of fn's kernels takes, its launches): fn run once while
    the backend records its launches, then those replayed (replay_seconds). A --tiny
    rehearsal has run them once, recorded: it replays nothing and measures nothing
    (nan; replay_seconds' own rehearsals run what no kernel ran before)."""
    from tinypaged.kernels.cuda.step_recording import StepRecording
    once = StepRecording()
    with gpu.recording(once):
        fn()
    if TINY:
        return float("nan"), len(once)
    return replay_seconds(once.launches, once.workspace), len(once)


def copy_bandwidth():
    n = 1 << (12 if TINY else 28)  # 1 GiB of float32
    src, dst = cuda.device_array(n, np.float32), cuda.device_array(n, np.float32)
    seconds = timed(lambda: dst.copy_to_device(src), repeat=10)
    gbps = 2 * n * 4 / seconds / 1e9  # read + write
    report("device copy bandwidth (read + write)", gbps, "GB/s")
    COSTS["copy_gbps"] = gbps
    return gbps


@cuda.jit
def _empty_kernel(a, b, c, d, e, f):
    """Six array arguments, like the step's kernels; does nothing."""
    pass


def launch_costs():
    """Host seconds a Python launch costs (six array arguments), and device seconds a
    kernel node of a replayed CUDA graph costs."""
    from tinypaged.kernels.cuda.step_recording import StepRecording
    arrays = [cuda.device_array(16, np.float32) for _ in range(6)]
    n = 200 if TINY else 2000
    _empty_kernel[1, 32](*arrays)
    cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        _empty_kernel[1, 32](*arrays)
    cuda.synchronize()
    COSTS["launch_s"] = (time.perf_counter() - start) / n
    report("kernel launch from Python, 6 array args", COSTS["launch_s"] * 1e6, "us/launch",
           "(numba-cuda PR #288: ~6.6 us + ~3.5 us an array argument)")
    recording = StepRecording()
    nodes = 245
    for _ in range(nodes):
        recording.add(_empty_kernel, 1, 32, tuple(arrays))
    if cuda.is_available() and not TINY:
        recording.capture_graph()
    seconds = timed(recording.launch, repeat=5 if TINY else 50)
    COSTS["node_s"] = seconds / nodes
    report(f"CUDA graph of {nodes} empty kernels, a node", COSTS["node_s"] * 1e6, "us/node",
           f"{seconds * 1e6:.0f} us a graph launch")


def attention_decode(copy_gbps):
    for batch, ctx in ((2, 32), (1, 140)) if TINY else ((64, 1024), (1, 8192)):
        for pool_dtype in ("float32", "float16", "int8"):
            _attention_row(copy_gbps, batch, ctx, pool_dtype)


def _attention_row(copy_gbps, batch, ctx, pool_dtype):
    gpu = CudaBackend()
    # SmolLM2's attention shape; the rehearsal's fewer heads take the same code paths
    # (the 140 keys still span two partitions; 32 dimensions: one int8 block a row)
    bs, n_heads, n_kv, d = (16, 4, 2, 32) if TINY else (16, 9, 3, 64)
    blocks_per_seq = -(-ctx // bs)
    n_blocks = batch * blocks_per_seq
    rng = np.random.default_rng(0)
    k_pool, v_pool = gpu.allocate_kv((1, n_blocks, bs, n_kv, d), np.dtype(pool_dtype))
    values = rng.standard_normal((2, 1, n_blocks, bs, n_kv, d), dtype=np.float32)
    host = quantize_rows(values) if pool_dtype == "int8" else values.astype(pool_dtype)
    gpu.kv_pool.copy_to_device(host)
    k, v = k_pool[0], v_pool[0]
    perm = rng.permutation(n_blocks)
    tables = [list(perm[i * blocks_per_seq:(i + 1) * blocks_per_seq]) for i in range(batch)]
    meta = AttentionMetadata.build([(t, ctx - 1, ctx) for t in tables], bs)
    _, dev_meta = gpu.prepare_inputs(np.zeros(batch, np.int64), meta)
    q = cuda.to_device(rng.standard_normal((batch, n_heads, d), dtype=np.float32))

    seconds, launches = device_seconds(gpu, lambda: gpu.paged_attention(q, k, v, dev_meta))
    unique = 2 * batch * ctx * n_kv * host.shape[-1] * host.itemsize  # the contexts' K/V bytes
    gbps = unique / seconds / 1e9
    want = predicted_seconds(unique, launches=0, graph_nodes=launches)
    report(f"paged attention decode, {batch} x {ctx} ctx, {pool_dtype} pool", gbps, "GB/s",
           f"{gbps / copy_gbps:.0%} of copy bandwidth; {seconds * 1e6:.0f} us "
           f"(predicted {want * 1e6:.0f}); {decode_split(batch, n_kv, n_heads // n_kv, dev_meta.decode_keys, gpu.launcher.sms)[0]} partitions",
           predicted=unique / want / 1e9)


def matmuls():
    gpu = CudaBackend()
    rng = np.random.default_rng(1)
    shapes = ((576, 576), (1536, 576), (576, 1536), (49152, 576))
    for n_out, width in (((8, 16),) if TINY else shapes):
        # one upload per shape (the 49152 x 576 lm_head is 57 MB), every batch over it
        w = DeviceFloat(rng.standard_normal((n_out, width), dtype=np.float32), np.float16)
        for rows in ((1, 9) if TINY else (1, 8, 64, 512)):
            x = cuda.to_device(rng.standard_normal((rows, width), dtype=np.float32))

            seconds, launches = device_seconds(gpu, lambda: gpu.linear(x, w))
            weight_bytes = n_out * width * 2
            weight_gbps = weight_bytes / seconds / 1e9
            want = predicted_seconds(weight_bytes + rows * (width + n_out) * 4, launches=0,
                                     graph_nodes=launches)
            report(f"linear M={rows} {width}->{n_out} (f16 W)", weight_gbps, "GB/s of W",
                   f"{weight_gbps / COSTS['copy_gbps']:.0%} of copy; "
                   f"{2 * rows * n_out * width / seconds / 1e12:.2f} TFLOP/s; {seconds * 1e6:.0f} us",
                   predicted=weight_bytes / want / 1e9)


def batch_one_gemvs():
    """lm_head's GEMV (SmolLM2's 49,152 x 576, one row of x) two rows a block, as the
    backend launches it past matmul.PAIRED_FROM_ROWS, against a row a block: float16
    (and its one-row form, the step's loads hoisted, as batch 1 launches it), and Q8_0
    (the default GGUF's output matrix, Gemma 3's too); then down_proj's shape (576 x
    1,536: two steps a thread) a row a block, the 8-row loop against the one-row form,
    in float16 and in Q4_1 (the default GGUF's kind: packed_matmul's one-row family).
    The card's answer to whether pairing halves the waves' cost and whether a step of
    the 8-row loop, waiting on each weight in turn, costs more than one round trip."""
    from tinypaged.formats.packed import PackedWeight
    from tinypaged.formats.quant_kind import Q4_1, Q8_0
    from tinypaged.kernels.cuda import matmul, packed_matmul
    rng = np.random.default_rng(2)
    n_out, width = (40, 32) if TINY else (49152, 576)
    host = rng.standard_normal((n_out, width), dtype=np.float32)
    w = cuda.to_device(host.astype(np.float16))
    q8 = packed_matmul.upload(PackedWeight.quantize(host, Q8_0))[1]
    half = -(-n_out // 2)
    down_rows, down_width = (24, 48) if TINY else (576, 1536)
    w_down = cuda.to_device(rng.standard_normal((down_rows, down_width), dtype=np.float32).astype(np.float16))
    lm_head, down = (n_out, width), (down_rows, down_width)
    packed_width = 64 if TINY else down_width  # (Q4_1: a multiple of 64 columns)
    q4_down = packed_matmul.upload(PackedWeight.quantize(
        rng.standard_normal((down_rows, packed_width), dtype=np.float32), Q4_1))[1]
    q4_shape, q4_bytes = (down_rows, packed_width), 20 * down_rows * packed_width // 32
    for name, kernel, matrix, (rows, k), blocks, nbytes in (
            ("f16 W, a row a block", matmul.gemv_rows, w, lm_head, n_out, 2 * n_out * width),
            ("f16 W, two rows a block", matmul.gemv_paired_rows, w, lm_head, half, 2 * n_out * width),
            ("f16 W, two rows a block, loads hoisted", matmul.gemv_one_row_paired, w, lm_head, half,
             2 * n_out * width),
            ("Q8_0 W, a row a block", packed_matmul.gemv_q8_0, q8, lm_head, n_out, 34 * n_out * width // 32),
            ("Q8_0 W, two rows a block", packed_matmul.gemv_q8_0_paired, q8, lm_head, half,
             34 * n_out * width // 32),
            ("f16 W, 8-row loop", matmul.gemv_rows, w_down, down, down_rows, 2 * down_rows * down_width),
            ("f16 W, loads hoisted", matmul.gemv_one_row, w_down, down, down_rows, 2 * down_rows * down_width),
            ("Q4_1 W, 8-row loop", packed_matmul.gemv_q4, q4_down, q4_shape, down_rows, q4_bytes),
            ("Q4_1 W, one-row form", packed_matmul.ONE_ROW_FAMILIES[Q4_1][0], q4_down, q4_shape, down_rows,
             q4_bytes)):
        x = cuda.to_device(rng.standard_normal((1, k), dtype=np.float32))
        no_bias, out = cuda.device_array(1, np.float32), cuda.device_array((1, rows), np.float32)
        seconds = replay_seconds([(kernel, matmul.gemv_blocks(blocks), matmul.GEMV_ROW_THREADS,
                                   (x, matrix, no_bias, False, out))])
        report(f"batch-1 GEMV {k}->{rows} ({name})", seconds * 1e6, "us",
               f"{nbytes / seconds / 1e9:.0f} GB/s of W")


def end_to_end(model_dir):
    """Decode tokens/s, eager and replayed, at batch 1, 8 and 64, beside the prediction
    bytes / bandwidth + host launches x launch cost + graph nodes x node cost."""
    from tinypaged import LLM, SamplingParams
    params = SamplingParams(temperature=0, max_tokens=3 if TINY else 64, ignore_eos=True)
    for cuda_graphs in (False, True):
        llm = LLM(model_dir, backend="cuda", cuda_graphs=cuda_graphs,
                  kv_cache_memory=(64 << 20) if TINY else (8 << 30))
        engine, ops = llm.engine, llm.engine.runner.model.ops
        weight_bytes = engine.weight_bytes
        llm.generate(["warm up"] * 2, SamplingParams(temperature=0, max_tokens=2 if TINY else 4,
                                                      ignore_eos=True))
        cfg = engine.model_config
        kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
        for batch in ((1, 2) if TINY else (1, 8, 64)):
            for i in range(batch):
                engine.add_request(f"Write a story about a lighthouse, number {i}.", params)
            engine.step()  # prefill
            engine.step()  # the first decode step at this batch (recorded, in graph mode)
            steps, tokens = 0, 0
            launches, graphs, transfers = ops.launcher.launches, ops.launcher.graph_launches, ops.launcher.transfers
            start = time.perf_counter()
            while engine.has_unfinished():
                outputs = engine.step()
                tokens += sum(len(o.outputs) for o in outputs)
                steps += 1
                failed = [o.error for o in outputs if o.error is not None]
                if failed:  # (a capture that failed would fail the step's requests)
                    print(f"model decode, batch {batch}: a step failed: {failed[0]!r}", flush=True)
            cuda.synchronize()
            if steps == 0:
                print(f"model decode, batch {batch}: no decode step ran", flush=True)
                continue
            rate = tokens / (time.perf_counter() - start)
            per_step = (ops.launcher.launches - launches) / steps
            graph_steps = (ops.launcher.graph_launches - graphs) / steps
            nodes = max((len(s.recording) for s in getattr(engine.runner.decode_graphs, "steps",
                                                           {}).values()), default=0)
            kv_bytes = batch * 48 * kv_per_token  # ~48 tokens of context on average
            step_s = predicted_seconds(weight_bytes + kv_bytes, launches=per_step + graph_steps,
                                       graph_nodes=nodes * graph_steps)
            mode = "graph" if cuda_graphs else "eager"
            name = f"model decode, batch {batch}, {mode}"
            predicted = (modeled(name, decode_tokens_per_s(cfg, batch, 48)) if cuda_graphs
                         else batch / step_s)  # (graph mode: the latency model, step_model.py)
            report(name, rate, "tokens/s",
                   f"{per_step:.0f} launches + {graph_steps:.0f} graph launches + "
                   f"{(ops.launcher.transfers - transfers) / steps:.1f} copies a step",
                   predicted=predicted)
        if cuda_graphs:
            for context in ((16,) if TINY else (128, 1024)):
                decode_at_context(engine, context)
            decode_at_context(engine, 16 if TINY else 512, batch=2 if TINY else 64)
            prefill_rate(engine, 40 if TINY else 2048)
            step_kernel_times(engine)
        del llm
    verification_costs(model_dir, "cuda", report, (0, 2) if TINY else (0, 1, 3, 7),
                       decoded=4 if TINY else 48)


def decode_at_context(engine, context, batch=1):
    """Graph-mode decode tokens/s of `batch` rows over the last n keys up to `context` (a
    prompt of context - n random tokens each, then n decoded: one recorded step serves
    them all, as context is a power of two), beside the latency model's step at their
    middle."""
    from tinypaged import SamplingParams
    cfg, n = engine.model_config, (4 if TINY else 64)
    rng = np.random.default_rng(context)
    rate = decode_rate(engine, [rng.integers(3, cfg.vocab_size, context - n).tolist() for _ in range(batch)],
                       SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    bar = {1: "1,000", 64: "15,000"}.get(batch, "none")
    name = f"model decode, batch {batch}, graph, {context - n + 2}-{context} keys"
    report(name, rate, "tokens/s", f"the issue's bar: {bar} tokens/s (SmolLM2 shapes)",
           predicted=modeled(name, decode_tokens_per_s(cfg, batch, context - n // 2)))


def prefill_rate(engine, prompt=2048):
    """Tokens/s of one prompt's prefill (random tokens: no prefix-cache hit), in the
    engine's chunks, twice (the second reported), beside step_model.prefill_prompt."""
    from tinypaged import SamplingParams
    from tinypaged.kernels.cuda.tools.step_model import prefill_prompt
    cfg = engine.model_config
    for seed in (1, 2):
        tokens = np.random.default_rng(seed).integers(3, cfg.vocab_size, prompt).tolist()
        engine.add_request(tokens, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        start = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        cuda.synchronize()
        seconds = time.perf_counter() - start
    shape = dict(hidden=cfg.hidden_size, layers=cfg.num_hidden_layers, heads=cfg.num_attention_heads,
                 kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                 intermediate=cfg.intermediate_size, vocab=cfg.vocab_size)
    chunk = engine.config.max_num_batched_tokens
    name = f"model prefill, a {prompt}-token prompt, {chunk} a step"
    report(name, prompt / seconds, "tokens/s", "the issue's bar: 40,000 tokens/s (SmolLM2 shapes)",
           predicted=modeled(name, lambda a: prefill_prompt(shape, prompt, chunk, a=a)["tokens_per_s"]))


def step_kernel_times(engine):
    """Device time of each kernel of the recorded decode steps at batch 1 and the
    largest bucket: each distinct launch (kernel, grid, block) captured 20 times into a
    graph and replayed, so no host launch gap is counted; then the whole step's graph."""
    steps = engine.runner.decode_graphs.steps
    for bucket in sorted({min(b for b, _ in steps), max(b for b, _ in steps)}):
        step = steps[bucket, max(k for b, k in steps if b == bucket)]  # (the buffer's contexts)
        kinds = {}  # (name, grid, block) -> [count, and the first launch: kernel, grid, block, args]
        for kernel, grid, block, args in step.recording.launches:
            name = getattr(kernel, "py_func", kernel).__name__
            kinds.setdefault((name, str(grid), str(block)), [0, kernel, grid, block, args])[0] += 1
        total = 0.0
        rows = []
        for (name, grid, block), (count, kernel, g, b, args) in kinds.items():
            seconds = replay_seconds([(kernel, g, b, args)])
            total += count * seconds
            rows.append((count * seconds, name, grid, block, count, seconds))
        for share, name, grid, block, count, seconds in sorted(rows, reverse=True):
            report(f"  bucket {bucket}: {name} grid {grid} block {block}", seconds * 1e6, "us each",
                   f"x{count} a step = {share * 1e6:.0f} us")
        whole = timed(step.recording.launch)
        report(f"decode step, bucket {bucket}, kernels one by one", total * 1e6, "us",
               f"{len(step.recording)} kernels; the whole graph replayed: {whole * 1e6:.0f} us")
        from tinypaged.kernels.cuda.tools.step_model import decode_step
        from tinypaged.kernels.cuda.tools.step_model import report as model_table
        cfg = engine.model_config  # the step model's table for the bucket, to set beside it
        print(model_table(decode_step(cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
                                      cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size,
                                      cfg.vocab_size, bucket, context=48), bucket), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--test-timeout", type=float, default=300,
                    help="seconds the CUDA tests may take (then they are stopped)")
    ap.add_argument("--model", default=os.path.join(ROOT, "weights", "smollm2-135m-instruct"))
    ap.add_argument("--shape-only", metavar="CONFIG_DIR",
                    help="time a model of CONFIG_DIR's shapes with random weights instead")
    ap.add_argument("--tiny", action="store_true",
                    help="small shapes: rehearse the script (NUMBA_ENABLE_CUDASIM=1 works)")
    args = ap.parse_args()
    global TINY
    TINY = args.tiny
    from numba import config
    if config.ENABLE_CUDASIM:  # a rehearsal: the simulator needs the tests' warp shim
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        import warp_shim
        warp_shim.install()
    name = getattr(cuda.get_current_device(), "name", "CUDA simulator")
    print(f"device: {name.decode() if isinstance(name, bytes) else name}", flush=True)
    preflight(simulated=config.ENABLE_CUDASIM)
    if TINY:
        args.skip_tests = True
    copy_gbps = copy_bandwidth()
    launch_costs()
    round_trips(report, timed, COSTS, TINY)
    attention_decode(copy_gbps)
    matmuls()
    batch_one_gemvs()
    if TINY:  # the rehearsal's model: one layer of width 16, small enough for the simulator
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from helpers import write_tiny_model
        write_tiny_model("/tmp/tinypaged-gpu-check-tiny", num_hidden_layers=1, hidden_size=16,
                         intermediate_size=16)
        end_to_end("/tmp/tinypaged-gpu-check-tiny")
        llama_1b_decode(report, "/tmp/tinypaged-gpu-check-tiny", tiny=True)
        packed_layer_products(report, device_seconds, tiny=True)
    elif args.shape_only:
        end_to_end(random_model_like(args.shape_only, "/tmp/tinypaged-shape-model"))
        llama_1b_decode(report, args.shape_only)
        packed_layer_products(report, device_seconds)
    elif is_model_folder(args.model):
        end_to_end(args.model)
    else:
        print(f"(no model at {args.model}: end-to-end rows skipped)")
    print("\n| figure | measured | predicted | unit | note |\n|---|---|---|---|---|")
    for name, value, unit, note, predicted in ROWS:
        guess = f"{predicted:.2f}" if predicted is not None else ""
        print(f"| {name} | {value:.2f} | {guess} | {unit} | {note} |")
    print_recalibrated(ROWS, COSTS)
    if not args.skip_tests:
        run_cuda_tests(is_model_folder(args.model), args.test_timeout)


def cuda_test_command(with_smollm2: bool, workers: int) -> list[str]:
    """pytest over the cuda tests of every file the GPU image can import
    (tests/cuda_test_files.py), without the compile-only (ptx) ones and, when the model
    is not here (no network to pull it), without the SmolLM2 ones; in `workers`
    processes, a test at a time, where pytest-xdist is there (their time is the host's:
    kernel compiles and Python launches, and the card's host has 16 cores)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from cuda_test_files import ON_THE_GPU_IMAGE
    marks = "cuda and not ptx" if with_smollm2 else "cuda and not ptx and not smollm2"
    parallel = ["-n", str(workers), "--dist", "load"] if workers > 1 else []
    return [sys.executable, "-m", "pytest", "-q", "-m", marks, *parallel,
            *(os.path.join(ROOT, "tests", name) for name in ON_THE_GPU_IMAGE)]


def run_cuda_tests(with_smollm2: bool, timeout: float) -> None:
    has_xdist = importlib.util.find_spec("xdist") is not None
    command = cuda_test_command(with_smollm2, min(8, (os.cpu_count() or 1) // 2) if has_xdist else 1)
    print(f"\n$ {' '.join(command[1:])}", flush=True)
    try:
        tests = subprocess.run(command, cwd=ROOT, timeout=timeout)
        print(f"cuda tests exit status: {tests.returncode}", flush=True)
    except subprocess.TimeoutExpired:
        print(f"cuda tests stopped after {timeout:.0f} s", flush=True)


if __name__ == "__main__":
    main()

"""Compile every CUDA kernel to PTX for a compute capability, without a GPU.

`python -m tinypaged.kernels.cuda.tools.ptx [MAJOR.MINOR]` prints one line per kernel
and signature: name, weight dtype, PTX size. `--resources` instead compiles each
to sm_90 SASS and prints its registers, stack frame, spills, shared memory and
theoretical occupancy (resources.py); `--audit [SHARD SHARDS]` prints all of it,
with each kernel's count of float64 and of fused multiply-add instructions, as JSON
from one compile (of every SHARDS-th kernel from SHARD). Needs numba-cuda with NVVM (the `cuda`
extra) and must run without NUMBA_ENABLE_CUDASIM. `--step-model CONFIG_DIR [BATCH
[CONTEXT [WEIGHTS]]]` (WEIGHTS float16, or a packed scheme: Q4_K_M, Q8_0, Q4_1) and
`--prefill-model CONFIG_DIR [PROMPT [CHUNK]]` print step_model.py's predictions for a
config.json's shapes instead (no compile).
"""
from __future__ import annotations

import json
import os
import re
import sys
from contextlib import contextmanager

from numba import cuda, types

from ....formats.quant_kind import KINDS
from ..device_weights import PACKED_KERNELS
from .. import (attention, elementwise, kquant_matmul, kv_rows, logits, lora, matmul, packed_matmul,
               prefill_attention, tiled_matmul)

f32, f16, i32, i64 = types.float32, types.float16, types.int32, types.int64
i8, u8 = types.int8, types.uint8


def arr(dtype, ndim):
    return types.Array(dtype, ndim, "C")


def packed_families() -> list[tuple[str, tuple, object]]:
    """(label, its decode kernels or its kind's code in kquant_matmul, the GEMVs' matrix
    tuple type) of each packed family: Q8_0 (int32 words), Q4_x, and kquant_matmul's
    five kinds (Q4_x's and theirs with the quants again as int32 words last)."""
    def matrix(*arrays, flag=i64):
        return types.Tuple((*arrays, flag))
    placeholder = arr(u8, 2)  # (mins or highs a kind lacks)
    families = [("q8_0", (packed_matmul.gemv_q8_0, packed_matmul.gemv_q8_0_qkv,
                          packed_matmul.gemv_q8_0_gate_up_silu, packed_matmul.gemv_q8_0_paired),
                 matrix(arr(i32, 2), arr(f16, 2), arr(f16, 2), flag=types.boolean)),
                ("q4", (packed_matmul.gemv_q4, packed_matmul.gemv_q4_qkv, packed_matmul.gemv_q4_gate_up_silu,
                        None),
                 types.Tuple((arr(u8, 2), arr(f16, 2), arr(f16, 2), types.boolean, arr(i32, 2))))]
    for code in kquant_matmul.DECODE_KERNELS:  # (a kind's arrays: formats/packed.py)
        kind = KINDS[code]
        scales = arr({"f16": f16, "k6": u8, "i8": i8}[kind.scales], 2)
        arrays = (arr(u8, 2), scales, scales if kind.has_mins else placeholder, arr(f16, 3),
                  arr(u8, 2) if kind.high_bits else placeholder)
        families.append((kind.name.lower(), code, types.Tuple((*arrays, i64, arr(i32, 2)))))
    return families


def tiled_signatures(suffix: str, kernels, matrix) -> list[tuple[str, object, tuple]]:
    """A weight kind's three tiled kernels (tiled_matmul.TiledKernels) over `matrix`."""
    x, bias, flag = arr(f32, 2), arr(f32, 1), types.boolean
    split = (arr(f32, 3), arr(i32, 2), i32)  # partials, arrivals, k_span
    sigs = [(f"matmul_tiled{suffix}", kernels.product, (x, matrix, bias, flag, x, *split)),
            (f"matmul_tiled_qkv{suffix}", kernels.qkv,
             (x, matrix, matrix, matrix, bias, bias, bias, flag, x, x, x, *split)),
            (f"matmul_tiled_gate_up_silu{suffix}", kernels.gate_up_silu, (x, matrix, matrix, x, *split))]
    return [sig for sig in sigs if sig[1] is not None]  # (None: a kind's products go one by one)


def signatures() -> list[tuple[str, object, tuple]]:
    """(label, kernel, argument types) for every kernel and dtype combination used."""
    sigs = []
    for wname, wtype in (("f16", f16), ("f32", f32)):
        mm = (arr(f32, 2), arr(wtype, 2), arr(f32, 1), types.boolean, arr(f32, 2))
        qkv = (arr(f32, 2), arr(wtype, 2), arr(wtype, 2), arr(wtype, 2), arr(f32, 1),
               arr(f32, 1), arr(f32, 1), types.boolean, arr(f32, 2), arr(f32, 2), arr(f32, 2))
        gate_up = (arr(f32, 2), arr(wtype, 2), arr(wtype, 2), arr(f32, 2))
        norm = types.Tuple((arr(f32, 2), arr(f32, 1), arr(f32, 2), f32, types.boolean))
        for suffix, kernels, extra in (("", (matmul.gemv_rows, matmul.gemv_qkv, matmul.gemv_gate_up_silu), ()),
                                       ("_normed", matmul.NORMED_GEMVS, (norm,))):
            sigs += [(f"gemv_{name}{suffix}[{wname}]", kernel, (*args, *extra)) for name, kernel, args
                     in zip(("rows", "qkv", "gate_up_silu"), kernels, (mm, qkv, gate_up), strict=True)]
        sigs += [(f"gemv_{name}[{wname}]", kernel, mm) for name, kernel in (
            ("paired_rows", matmul.gemv_paired_rows), ("one_row", matmul.gemv_one_row),
            ("one_row_paired", matmul.gemv_one_row_paired))]
        sigs += tiled_signatures(f"[{wname}]", tiled_matmul.FLOAT_TILED, arr(wtype, 2))
    x, bias, flag = arr(f32, 2), arr(f32, 1), types.boolean
    one_row = {k.gemv: k.one_row for k in PACKED_KERNELS.values()}  # (a family's, by its GEMV)
    for qname, kernels, matrix in packed_families():
        decode = kquant_matmul.DECODE_KERNELS.get(kernels, kernels)
        for form, family in (("", decode), ("_one_row", one_row[decode[0]])):
            gemv, qkv, gate_up, paired = family
            sigs += [(f"gemv_{qname}{form}", gemv, (x, matrix, bias, flag, x)),
                     (f"gemv_{qname}{form}_gate_up_silu", gate_up, (x, matrix, matrix, x))]
            if paired is not None:
                sigs.append((f"gemv_{qname}{form}_paired", paired, (x, matrix, bias, flag, x)))
            if qkv is not None:
                sigs.append((f"gemv_{qname}{form}_qkv", qkv,
                             (x, matrix, matrix, matrix, bias, bias, bias, flag, x, x, x)))
    for qname, qtype in (("q8_0", i8), ("q4", u8)):  # (the tiled product reads Q8_0 as bytes)
        matrix = types.Tuple((arr(qtype, 2), arr(f16, 2), arr(f16, 2), i64))
        sigs += tiled_signatures(f"_packed[{qname}]", packed_matmul.TILED_PACKED, matrix)
    for qname, kind, matrix in packed_families()[2:]:  # (the tiled products' tuple: no words)
        sigs += tiled_signatures(f"_packed[{qname}]", kquant_matmul.TILED_KERNELS[kind],
                                 types.Tuple(matrix.types[:-1]))
    q = arr(f32, 3)
    q8_layer = types.Tuple((arr(i8, 4), types.Array(f16, 4, "A")))  # kv_rows.py's (rows, scales)
    for kv_name, kv_type, pool in (("", f32, arr(f32, 4)), ("[kv-f16]", f16, arr(f16, 4)),
                                   ("[kv-int8]", i8, q8_layer)):  # the KV pool's form
        form = "q8" if kv_type == i8 else ""  # (kv_rows.POOL_READS' keys)
        attn = (q, pool, pool, arr(i32, 2), arr(i32, 1), arr(i32, 1))
        rope = kv_rows.rope_write_kv_q8 if form else elementwise.rope_write_kv
        sigs += [
            ("paged_attention_decode" + kv_name, attention.DECODE[form],  # (its rows' tables)
             (*attn[:5], arr(i32, 1), f32, i32, f32, i32, arr(f32, 4), arr(f32, 4), arr(i32, 2),
              arr(f32, 3))),
            *((f"paged_attention_prefill[d{width}]" + kv_name, prefill_attention.PREFILL[form, width],
               (*attn, arr(i32, 2), f32, i32, f32, arr(f32, 3))) for width in prefill_attention.KV_TILES),
            ("rope_write_kv" + kv_name, rope,
             (q, q, q, arr(i32, 1), arr(f32, 2), arr(f32, 2), pool, pool, arr(i32, 1))),
            ("copy_blocks" + kv_name, elementwise.copy_blocks,
             (arr(kv_type, 5), arr(kv_type, 5), arr(i32, 2))),
        ]
    sigs += [
        ("add_rms_norm", elementwise.add_rms_norm,
         (arr(f32, 2), arr(f32, 2), types.boolean, arr(f32, 1), f32, arr(f32, 2), arr(f32, 2),
          arr(f32, 2), types.boolean)),
        ("silu_mul", elementwise.silu_mul, (arr(f32, 2), arr(f32, 2), arr(f32, 2))),
        ("scale", elementwise.scale, (arr(f32, 2), f32, arr(f32, 2))),
        ("softcap", elementwise.softcap, (arr(f32, 2), f32, arr(f32, 2))),
        ("gelu_tanh_mul", elementwise.gelu_tanh_mul, (arr(f32, 2), arr(f32, 2), arr(f32, 2))),
        ("add", elementwise.add, (arr(f32, 2), arr(f32, 2), arr(f32, 2))),
        ("gather_rows", elementwise.gather_rows, (arr(f32, 2), arr(i32, 1), arr(f32, 2))),
        ("round_activations", elementwise.round_activations, (arr(f32, 2), arr(f32, 2))),
        ("top_candidates", logits.top_candidates, (arr(f32, 2), arr(i32, 1), i64, arr(f32, 3))),
    ]
    for wname, wtype in (("f16", f16), ("f32", f32)):  # (LoRASlots' dtypes)
        sigs += [(f"lora_shrink[{wname}]", lora.lora_shrink,
                  (arr(f32, 2), arr(wtype, 3), arr(i32, 1), arr(f32, 1), arr(i32, 1), arr(i32, 1),
                   arr(f32, 2))),
                 (f"lora_expand[{wname}]", lora.lora_expand,
                  (arr(f32, 2), arr(wtype, 3), arr(i32, 1), arr(i32, 1), arr(i32, 1), arr(f32, 2)))]
    return sigs


def block_threads(label: str) -> int:
    """Threads per block the backend launches the kernel with (RoPE: a 128-wide head)."""
    name = label.split("[")[0]
    return {**{f"matmul_tiled{form}": tiled_matmul.TILED_THREADS
               for form in ("", "_qkv", "_gate_up_silu", "_packed", "_qkv_packed", "_gate_up_silu_packed")},
            **{f"gemv_{q}{form}{f}": matmul.GEMV_ROW_THREADS for q, _, _ in packed_families()
               for form in ("", "_one_row") for f in ("", "_qkv", "_gate_up_silu", "_paired")},
            **{f"gemv_{name}{suffix}": matmul.GEMV_ROW_THREADS
               for name in ("qkv", "gate_up_silu", "rows", "paired_rows", "one_row", "one_row_paired")
               for suffix in ("", "_normed")},  # (paired_rows, one_row: no normed one)
            "paged_attention_decode": attention.DECODE_THREADS,
            "paged_attention_prefill": prefill_attention.PREFILL_THREADS,
            "add_rms_norm": elementwise.NORM_THREADS, "rope_write_kv": kv_rows.rope_write_threads(kv_rows.MAX_HEAD_DIM),
            "silu_mul": 256, "scale": 256, "add": 256, "gelu_tanh_mul": 256, "softcap": 256, "gather_rows": elementwise.ROW_THREADS,
            "copy_blocks": elementwise.ROW_THREADS,
            "round_activations": elementwise.ROUND_THREADS,
            "top_candidates": logits.TOP_THREADS, "lora_shrink": lora.SHRINK_THREADS,
            "lora_expand": lora.EXPAND_THREADS}[name]


def resources(compiled: dict[str, str] | None = None) -> list:
    """Every kernel's resources on sm_90 (resources.KernelResources)."""
    from .resources import measure
    compiled = compiled if compiled is not None else compile_all((9, 0))
    return [measure(label, ptx, block_threads(label)) for label, ptx in compiled.items()]


def float64_instructions(ptx: str) -> int:
    """PTX instructions on float64 (a float32 kernel should have none: each is a
    slow double-precision operation, and a result that differs from float32's)."""
    return len(re.findall(r"^\s*[a-z][\w.]*\.f64\b", ptx, flags=re.MULTILINE))


def fused_multiply_adds(ptx: str) -> int:
    """fma instructions in float32 (each rounds a*b+c once: exact.py)."""
    return len(re.findall(r"^\s*fma\.\w+\.f32\b", ptx, flags=re.MULTILINE))


def audit(shard: int = 0, shards: int = 1) -> dict:
    """One compile of every kernel for sm_90 (or of every shards-th from `shard`: the
    tests run two processes at once): label -> its PTX size, float64 instructions and
    resources (what the tests check without a GPU)."""
    compiled = compile_all((9, 0), shard, shards)
    return {r.label: {"ptx_bytes": len(compiled[r.label]),
                      "float64_instructions": float64_instructions(compiled[r.label]),
                      "fma_instructions": fused_multiply_adds(compiled[r.label]),
                      "threads": r.threads, "registers": r.registers, "stack": r.stack_bytes,
                      "spills": r.spill_bytes, "shared": r.shared_bytes,
                      "occupancy": r.occupancy}
            for r in resources(compiled)}


def compile_all(cc: tuple[int, int] = (9, 0), shard: int = 0, shards: int = 1) -> dict[str, str]:
    """label -> PTX text (of every shards-th signature from `shard`)."""
    return {label: compile_kernel(kernel, args, cc) for label, kernel, args in signatures()[shard::shards]}


def compile_kernel(kernel, args: tuple, cc: tuple[int, int] = (9, 0)) -> str:
    """One kernel's PTX for compute capability cc, with or without a GPU."""
    with _device_functions_for(cc):
        return cuda.compile_ptx(kernel.py_func, args, cc=cc,
                                launch_bounds=kernel.targetoptions.get("launch_bounds"))[0]


@contextmanager
def _device_functions_for(cc: tuple[int, int]):
    """numba-cuda compiles a device function (device_function.py) for the current
    device's compute capability, and without a GPU there is none to ask: answer cc."""
    from numba.cuda import dispatcher

    class Device:
        compute_capability = cc
    current = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: Device
    try:
        yield
    finally:
        dispatcher.get_current_device = current


def _shape(config_dir: str) -> dict:
    """The step model's shape arguments from the config.json in config_dir."""
    with open(os.path.join(config_dir, "config.json")) as f:
        cfg = json.load(f)
    heads = cfg["num_attention_heads"]
    return dict(hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"], heads=heads,
                kv_heads=cfg.get("num_key_value_heads", heads),
                head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"])


def step_model_report(config_dir: str, batch: str = "1", context: str = "64",
                      weights: str = "float16") -> str:
    """The latency model (step_model.py) of a decode step of the model whose
    config.json is in config_dir (its shapes only), float16 weights or a packed
    scheme (step_model.PACKED: Q4_K_M, Q8_0, Q4_1)."""
    from .step_model import PACKED, decode_step, report
    if weights != "float16" and weights not in PACKED:
        raise SystemExit(f"weights={weights!r} is not float16 or one of {sorted(PACKED)}")
    return report(decode_step(**_shape(config_dir), batch=int(batch), context=int(context),
                              kinds=PACKED.get(weights)), int(batch))


def prefill_model_report(config_dir: str, prompt: str = "2048", chunk: str = "512") -> str:
    """The model of a prompt's prefill, `chunk` tokens a step: the last step's table,
    then each step's time and the prompt's tokens/s."""
    from .step_model import prefill_prompt, prefill_step, report
    shape, prompt, chunk = _shape(config_dir), int(prompt), int(chunk)
    result = prefill_prompt(shape, prompt, chunk)
    last = (prompt - 1) // chunk * chunk
    lines = [report(prefill_step(**shape, rows=prompt - last, before=last), prompt - last)]
    lines += [f"step {i}: {s['step_us']:.0f} us" for i, s in enumerate(result["steps"])]
    lines.append(f"predicted prefill: {result['prompt_us']:.0f} us for {prompt} tokens, {chunk} a step: "
                 f"{result['tokens_per_s']:.0f} tokens/s")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--audit"]:  # --audit [SHARD SHARDS]
        print(json.dumps(audit(*(int(a) for a in argv[1:3]))))
        return
    if argv[:1] == ["--resources"]:
        from .resources import table
        print(table(resources()))
        return
    if argv[:1] == ["--step-model"]:  # --step-model CONFIG_DIR [BATCH [CONTEXT [WEIGHTS]]]
        print(step_model_report(*argv[1:]))
        return
    if argv[:1] == ["--prefill-model"]:  # --prefill-model CONFIG_DIR [PROMPT [CHUNK]]
        print(prefill_model_report(*argv[1:]))
        return
    if argv and not re.fullmatch(r"\d+\.\d+", argv[0]):
        raise SystemExit(f"{argv[0]!r} is not MAJOR.MINOR or an option of:\n{__doc__}")
    cc = tuple(int(p) for p in argv[0].split(".")) if argv else (9, 0)
    for label, ptx in compile_all(cc).items():
        print(f"{label} sm_{cc[0]}{cc[1]} {len(ptx)} bytes of PTX")


if __name__ == "__main__":
    main(sys.argv[1:])

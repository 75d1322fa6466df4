"""The decode step's latency model (kernels/cuda/tools/step_model.py): its kernels are the
ones a recorded step launches, and the design it describes reaches the goal of
issue 33 (SmolLM2, batch 1, graph mode: >= 1,000 tokens/s) under its assumptions."""
import pytest

from tinypaged.kernels.cuda.tools.step_model import (ASSUMPTIONS, KernelCost, decode_step, predict, prefill_prompt,
                                                     prefill_step, tiled_product)

SMOLLM2 = dict(hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64, intermediate=1536,
               vocab=49152)


@pytest.mark.parametrize("context", [64, 128, 1024])
def test_smollm2_batch_1_is_predicted_at_1000_tokens_a_second_or_more(context):
    """Issue 45's bar at 128 and 1,024 keys of context."""
    result = predict(decode_step(**SMOLLM2, batch=1, context=context))
    assert 1e6 / result["step_us"] >= 1000
    # 6 kernels a layer (its two norms folded into the GEMVs after them), 3 row gathers,
    # the final norm, lm_head and the argmax: what test_cuda_graphs counts for a
    # 30-layer step (185 launches + the argmax)
    assert result["launches"] == 186
    assert result["bound_by"] in {k.name for k in decode_step(**SMOLLM2)}


def test_the_norms_fold_up_to_normed_max_rows():
    """Past NORMED_MAX_ROWS rows each layer launches its two norms again."""
    from tinypaged.kernels.cuda.matmul import NORMED_MAX_ROWS
    folded, not_folded = (predict(decode_step(**SMOLLM2, batch=b, context=128))
                          for b in (NORMED_MAX_ROWS, NORMED_MAX_ROWS + 1))
    assert not_folded["launches"] - folded["launches"] == 2 * SMOLLM2["layers"]


def test_a_long_context_costs_more_in_the_same_launches():
    """The decode attention merges its own partitions: no launch more at 8,192 keys."""
    short = predict(decode_step(**SMOLLM2, context=64))
    long = predict(decode_step(**SMOLLM2, context=8192))
    assert long["launches"] == short["launches"] == 186
    assert long["step_us"] > short["step_us"]


def test_a_kernel_costs_its_bandwidth_or_its_latency_whichever_is_more():
    node, sync = ASSUMPTIONS["node_us"], ASSUMPTIONS["sync_us"]
    streaming = KernelCost("copy", 1, 400_000_000, 132 * 8, 256, 1, 0)  # 100 us at 4 TB/s
    assert streaming.micros() == pytest.approx(node + 100.0)
    waiting = KernelCost("chain", 1, 1000, 1, 32, 5, 2)  # five dependent loads
    assert waiting.micros() == pytest.approx(node + 5 * ASSUMPTIONS["round_trip_us"] + 2 * sync)
    waves = KernelCost("wide", 1, 1000, 132 * 16 * 3, 128, 1, 0)  # the grid fills the GPU 3 times
    assert waves.waves() == 3


def test_batches_past_the_gemvs_run_the_tiled_products():
    """Batch 64: q/k/v, o, gate/up (SiLU fused) and down as tiled products (split along K
    to fill the SMs), lm_head tiled too: as many launches as the GEMVs' step."""
    gemv, tiled = (predict(decode_step(**SMOLLM2, batch=b, context=512)) for b in (8, 64))
    assert tiled["launches"] == gemv["launches"] == 246
    names = {k.name for _, k in tiled["costs"]}
    assert {"tiled qkv", "tiled gate_up_silu", "tiled down_proj", "tiled lm_head"} <= names
    assert not any(name.startswith("gemv") for name in names)
    assert tiled["step_us"] > gemv["step_us"]


def test_a_tiled_product_splits_k_at_decode_and_not_in_prefill():
    decode = tiled_product("o", 1, 64, 576, 576)  # 9 tiles: K split in 12 (48 wide)
    prefill = tiled_product("o", 1, 2048, 576, 576)  # 288 tiles, K whole: 36 slices each
    assert decode.blocks == 9 * 12 and decode.rounds == 1 + 3 + 2 + 3  # slices, fence and count, merge
    assert prefill.blocks == 288 and prefill.rounds == 1 + 36
    # shared loads: a warp's 16 x (4 + 4) a slice; 2 FLOPs an FMA, 2 FMAs a load
    flops = 2 * 2048 * 576 * 576
    assert prefill.shared_loads * 32 * 2 * 2 == flops


def test_compute_kernels_are_bound_by_their_shared_loads():
    a = ASSUMPTIONS
    one_us = int(a["sms"] * a["sm_clock_ghz"] * 1e3 * a["shared_loads_per_sm_clock"])
    compute = KernelCost("gemm", 1, 1000, 132, 256, 1, 0, shared_loads=100 * one_us)
    assert compute.micros() == pytest.approx(a["node_us"] + 100.0)


def test_a_prompt_is_prefilled_in_chunks_each_reading_the_keys_before_it():
    result = prefill_prompt(SMOLLM2, prompt=2048, chunk=512)
    times = [s["step_us"] for s in result["steps"]]
    assert len(times) == 4 and times == sorted(times)  # later chunks attend to more keys
    assert result["tokens_per_s"] == pytest.approx(2048e6 / sum(times))
    last = predict(prefill_step(**SMOLLM2, rows=512, before=1536))
    assert last["step_us"] == pytest.approx(times[-1])


def test_the_resource_report_prints_the_model_for_a_config(tmp_path):
    """`python -m tinypaged.kernels.cuda.tools.ptx --step-model DIR [BATCH [CONTEXT]]`: a
    config.json's shapes (SmolLM2's here), the table, the assumptions, the verdict."""
    import json
    import re
    import subprocess
    import sys
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152}))
    result = subprocess.run([sys.executable, "-m", "tinypaged.kernels.cuda.tools.ptx", "--step-model",
                             str(tmp_path), "1", "48"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "assumptions: node_us=0.51" in result.stdout
    verdict = re.search(r"predicted step: (\d+) us, 186 launches: (\d+) tokens/s at batch 1; "
                        r"bound by (\S+)", result.stdout)
    assert verdict and int(verdict[2]) >= 1000, result.stdout[-1500:]
    for weights in ("Q4_K_M", "Q9"):  # a packed scheme; a name it does not know, refused
        result = subprocess.run([sys.executable, "-m", "tinypaged.kernels.cuda.tools.ptx", "--step-model",
                                 str(tmp_path), "1", "48", weights], capture_output=True, text=True,
                                timeout=300)
        if weights == "Q9":
            assert result.returncode != 0 and "weights='Q9' is not float16 or one of" in result.stderr
        else:
            assert result.returncode == 0 and "packed gate_up_silu" in result.stdout, result.stderr[-2000:]


def test_the_design_reaches_issue_45s_batch_64_and_prefill_figures_under_the_model():
    """SmolLM2 shapes, float16: batch 64 at 512 keys >= 15,000 tokens/s, a 2,048-token
    prompt (512 a step) >= 40,000 (the card decides; the model says the design can)."""
    step = predict(decode_step(**SMOLLM2, batch=64, context=512))
    assert 64e6 / step["step_us"] >= 15_000
    assert prefill_prompt(SMOLLM2, prompt=2048, chunk=512)["tokens_per_s"] >= 40_000


LLAMA_1B = dict(hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, intermediate=8192,
                vocab=128256)


def test_the_design_reaches_issue_45s_llama_1b_figures_under_the_model():
    """Llama-3.2-1B shapes: batch 1 >= 500 tokens/s with Q4_K_M's kinds (the one-row
    packed GEMVs, q|k|v fused; the norms launched: they write x rounded) and >= 400 in
    float16; batch 64 >= 4,000. At batch 2 the 8-row GEMVs: Q4_K's q, k and v one by one."""
    from tinypaged.kernels.cuda.tools.step_model import PACKED
    packed = predict(decode_step(**LLAMA_1B, batch=1, context=128, kinds=PACKED["Q4_K_M"]))
    names = {k.name for _, k in packed["costs"]}
    assert {"packed qkv", "packed o_proj (paired)", "packed gate_up_silu"} <= names
    assert 1e6 / packed["step_us"] >= 500
    assert packed["launches"] == 16 * 8 + 6  # (2 norms, q|k|v, RoPE, attention, o, gate/up, down)
    two = decode_step(**LLAMA_1B, batch=2, context=128, kinds=PACKED["Q4_K_M"])
    assert {"packed q_proj (paired)", "packed k_proj", "packed v_proj"} <= {k.name for k in two}
    assert 1e6 / predict(decode_step(**LLAMA_1B, batch=1, context=128))["step_us"] >= 400
    assert 64e6 / predict(decode_step(**LLAMA_1B, batch=64, context=512))["step_us"] >= 4000


def test_a_packed_gemv_takes_a_step_for_each_block_width_of_its_row():
    """A block a row: 128 threads x 4 nibble bytes (1,024 weights) or 4 Q8_0 words (512
    weights) a step; gate and up in the same steps where their pass fits."""
    from tinypaged.formats.quant_kind import Q4_K, Q5_0, Q6_K, Q8_0
    from tinypaged.kernels.cuda.tools.step_model import _packed_gemv
    assert _packed_gemv("q4", 1, Q4_K, 10, 2048).rounds == 2
    assert _packed_gemv("q8", 1, Q8_0, 10, 2048).rounds == 4
    gate_up = _packed_gemv("gate_up", 1, Q4_K, 10, 2048, matrices=2)
    assert gate_up.rounds == 2 and gate_up.bytes == 2 * 10 * 2048 * 144 // 256
    # gate's steps, then up's, where that pass spilled: Q5_0 and Q6_K at 8 rows of x, not at one
    for kind in (Q5_0, Q6_K):
        assert _packed_gemv("gate_up", 1, kind, 10, 2048, matrices=2).rounds == 4
        assert _packed_gemv("gate_up", 1, kind, 10, 2048, matrices=2, one_row=True).rounds == 2


def test_a_float_matrix_past_a_waves_rows_is_priced_two_rows_a_block():
    """As DeviceFloat.product launches it (matmul.pairs_rows): SmolLM2's lm_head (49,152
    rows) in 24,576 blocks, half the waves; its o and down (576 rows) a row a block;
    Llama-3.2-1B's o and down (2,048 rows) in pairs too; batch 1 names the one-row
    forms, batch 2 the 8-row ones, at the same price."""
    def rows_gemvs(shape, batch=1):
        return {k.name: k for k in decode_step(**shape, batch=batch, context=128) if "gemv_" in k.name
                and "(" in k.name}
    small, large, two = rows_gemvs(SMOLLM2), rows_gemvs(LLAMA_1B), rows_gemvs(SMOLLM2, batch=2)
    assert small["gemv_one_row_paired (lm_head)"].blocks == 49152 // 2
    assert small["gemv_one_row_paired (lm_head)"].waves() == 24  # (132 SMs x 8 blocks a wave)
    assert {"gemv_one_row (o_proj)", "gemv_one_row (down_proj)"} <= set(small)
    assert {"gemv_one_row_paired (o_proj)", "gemv_one_row_paired (down_proj)"} <= set(large)
    assert {"gemv_paired_rows (lm_head)", "gemv_rows (o_proj)", "gemv_rows (down_proj)"} <= set(two)
    assert (two["gemv_paired_rows (lm_head)"].rounds, two["gemv_paired_rows (lm_head)"].blocks) == (
        small["gemv_one_row_paired (lm_head)"].rounds, small["gemv_one_row_paired (lm_head)"].blocks)


def test_a_packed_product_past_a_waves_rows_is_priced_two_rows_a_block():
    """As DevicePacked.product launches it: the default GGUF's lm_head (SmolLM2, Q8_0) in
    pairs, half the waves, both rows' sums; Llama-3.2-1B Q4_K_M's o (Q4_K, 2,048 rows)
    and lm_head (Q6_K: a pair for one row of x only) in pairs at batch 1, its lm_head a
    row a block at batch 2; q|k|v's fused launch over 1,536 rows (Gemma 3's shapes)
    never paired."""
    from tinypaged.formats.quant_kind import Q8_0
    from tinypaged.kernels.cuda.tools.step_model import PACKED, _packed_gemv
    def gemvs(shape, scheme):
        return {k.name: k for k in decode_step(**shape, batch=1, context=128, kinds=PACKED[scheme])}
    small, large = gemvs(SMOLLM2, "Q4_1"), gemvs(LLAMA_1B, "Q4_K_M")
    lm_head = small["packed lm_head (paired)"]
    assert (lm_head.blocks, lm_head.waves(), lm_head.syncs) == (49152 // 2, 24, 4)
    assert {"packed qkv", "packed o_proj (paired)", "packed lm_head (paired)"} <= set(large)
    two = {k.name for k in decode_step(**LLAMA_1B, batch=2, context=128, kinds=PACKED["Q4_K_M"])}
    assert {"packed lm_head", "packed o_proj (paired)"} <= two
    fused = _packed_gemv("packed qkv", 1, Q8_0, 1536, 640, fused=True)
    assert fused.name == "packed qkv" and fused.blocks == 1536


def test_the_8_row_loops_wait_on_a_steps_later_weights_from_l1():
    """bench/sass.py's reading, priced: row_dots' 8-row loop waits on each of a step's
    FLOAT_VEC weights (the first a round trip, the rest L1 hits), the one-row GEMVs
    (batch 1's o, down, lm_head) on the step's loads once; a nibble kind's packed step
    on each of its VEC quant bytes, Q8_0's word once. Each L1 wait costs l1_hit_us."""
    from tinypaged.formats.quant_kind import Q4_K, Q8_0
    from tinypaged.kernels.cuda.matmul import FLOAT_VEC, VEC
    from tinypaged.kernels.cuda.tools.step_model import _packed_gemv
    one, two = ({k.name: k for k in decode_step(**SMOLLM2, batch=b, context=128)} for b in (1, 2))
    assert one["gemv_one_row (down_proj)"].l1_waits == 0
    assert two["gemv_rows (down_proj)"].l1_waits == 2 * (FLOAT_VEC - 1)  # (1,536 wide: two steps)
    assert one["gemv_qkv"].l1_waits == two["gemv_qkv"].l1_waits == FLOAT_VEC - 1  # (normed at batch 1)
    assert _packed_gemv("q4_k", 1, Q4_K, 10, 2048).l1_waits == 2 * (VEC - 1)
    assert _packed_gemv("q4_k", 1, Q4_K, 10, 2048, one_row=True).l1_waits == 0  # (a word, x with it)
    assert _packed_gemv("q4_k", 1, Q4_K, 10, 2048, matrices=2, one_row=True).l1_waits == 2 * (VEC - 1)
    assert _packed_gemv("q8_0", 1, Q8_0, 10, 2048).l1_waits == 0
    qkv = one["gemv_qkv"]
    slower = dict(ASSUMPTIONS, l1_hit_us=ASSUMPTIONS["l1_hit_us"] + 1.0)
    assert qkv.micros(slower) - qkv.micros() == pytest.approx(qkv.waves() * (FLOAT_VEC - 1))

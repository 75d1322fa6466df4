"""Recorded decode steps (kernels/cuda/decode_graphs.py) against the eager step.

On the simulator a recording is replayed launch by launch; on a GPU it is a CUDA
graph. Either way, a replayed step with rewritten input buffers must give exactly
the eager step's logits, through batches that grow, shrink, fork (copy-on-write),
preempt and cross block boundaries.
"""
import numpy as np
import pytest
from helpers import write_tiny_model

from tinypaged import SamplingParams
from tinypaged.config import EngineConfig
from tinypaged.batch.attention_metadata import AttentionMetadata
from tinypaged.engine.llm_engine import LLMEngine
from tinypaged.kernels.cuda import cuda_usable
from tinypaged.kernels.cuda.static_decode import (PAD_POSITION, bucket_for, bucket_sizes,
                                                   pack_decode_step)
from tinypaged.kernels.cuda.step_recording import StepRecording

pytestmark = pytest.mark.cuda


def test_buckets_are_powers_of_two_up_to_the_batch_limit():
    assert bucket_sizes(1) == [1]
    assert bucket_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert bucket_sizes(40) == [1, 2, 4, 8, 16, 32, 64]
    buckets = bucket_sizes(64)
    assert [bucket_for(n, buckets) for n in (1, 2, 3, 5, 8, 9, 33, 64)] == [1, 2, 4, 8, 8, 16, 64, 64]
    with pytest.raises(ValueError, match="65 rows exceeds the largest bucket 64"):
        bucket_for(65, buckets)


def test_a_packed_decode_step_pads_rows_and_block_tables():
    meta = AttentionMetadata.build([([5, 9], 20, 21), ([3], 2, 3), ([7, 8, 1], 40, 41)],
                                   block_size=16)
    packed = pack_decode_step(np.array([11, 12, 13]), meta, bucket=4, max_blocks=5)
    ids, positions, slots = packed[:4], packed[4:8], packed[8:12]
    tables = packed[12:].reshape(4, 5)
    np.testing.assert_array_equal(ids, [11, 12, 13, 0])
    np.testing.assert_array_equal(positions, [20, 2, 40, PAD_POSITION])
    np.testing.assert_array_equal(slots, [9 * 16 + 4, 3 * 16 + 2, 1 * 16 + 8, -1])
    np.testing.assert_array_equal(tables, [[5, 9, -1, -1, -1], [3, -1, -1, -1, -1],
                                           [7, 8, 1, -1, -1], [-1] * 5])
    assert packed.dtype == np.int32


def _record_logits(engine: LLMEngine) -> list[np.ndarray]:
    """Keeps a copy of every step's logits (whole rows: fetched for the record)."""
    logits, run = [], engine.runner.forward

    def recorded_run(batch, rows=None, needs=None, pooled=None):
        out = run(batch, rows, needs, pooled)
        logits.append(np.array(out.rows(list(range(len(out))))))
        return out
    engine.runner.forward = recorded_run
    return logits


def _assert_same_steps(graph_logits, eager_logits):
    assert len(graph_logits) == len(eager_logits)
    for i, (got, want) in enumerate(zip(graph_logits, eager_logits)):
        np.testing.assert_array_equal(got, want, err_msg=f"step {i}")


def test_replayed_steps_equal_eager_steps_token_for_token(cuda_model_dir):
    runs = {}
    for cuda_graphs in (False, True):
        engine = LLMEngine(cuda_model_dir, EngineConfig(backend="cuda", num_blocks=16,
                                                     cuda_graphs=cuda_graphs))
        logits = _record_logits(engine)
        engine.add_request("A tale", SamplingParams(temperature=0, max_tokens=5,
                                                              ignore_eos=True), request_id="a")
        engine.add_request("The cat", SamplingParams(temperature=0, max_tokens=3,
                                                     ignore_eos=True), request_id="b")
        outputs = {}
        while engine.has_unfinished():
            outputs.update({o.request_id: o.outputs[0].token_ids for o in engine.step()})
        runs[cuda_graphs] = logits, outputs, engine
    (eager_logits, eager_out, _), (graph_logits, graph_out, engine) = runs[False], runs[True]
    assert graph_out == eager_out and [len(graph_out[r]) for r in "ab"] == [5, 3]
    _assert_same_steps(graph_logits, eager_logits)
    assert engine.runner.model.ops.launcher.replays >= 2  # a step of each bucket run again
    assert {bucket for bucket, _ in engine.runner.decode_graphs.steps} == {1, 2}  # 2, then 1


def _pressure_engine(model_dir, cuda_graphs: bool) -> LLMEngine:
    """Small blocks (4 tokens) and a tight pool: block boundaries every few steps,
    copy-on-write for parallel samples, preemption when the batch grows."""
    return LLMEngine(model_dir, EngineConfig(backend="cuda", block_size=4, num_blocks=10,
                                             max_num_seqs=8, cuda_graphs=cuda_graphs))


def _drive(engine: LLMEngine) -> tuple[list[np.ndarray], dict]:
    """One request, then three more joining (one with two parallel samples), all
    finishing at different steps: the logits of every step, and the outputs."""
    logits = _record_logits(engine)
    greedy = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)
    engine.add_request([5, 6, 7, 8, 9], greedy, request_id="a")
    outputs = {}
    for step in range(60):
        if step == 2:
            engine.add_request(list(range(30, 40)), SamplingParams(
                temperature=0, max_tokens=5, ignore_eos=True), request_id="b")
            engine.add_request([70, 71], SamplingParams(temperature=0.8, seed=7, n=2,
                                                        max_tokens=7, ignore_eos=True),
                               request_id="c")
        if step == 4:
            engine.add_request([100, 101, 102, 103, 104, 105], greedy, request_id="d")
        for out in engine.step():
            outputs[out.request_id] = [c.token_ids for c in out.outputs]
        if step > 4 and not engine.has_unfinished():
            break
    return logits, outputs


def test_replayed_steps_equal_eager_steps_through_growth_forks_and_preemption(tiny_model_dir):
    eager_engine = _pressure_engine(tiny_model_dir, False)
    graph_engine = _pressure_engine(tiny_model_dir, True)
    assert eager_engine.runner.decode_graphs is None
    eager_logits, eager_out = _drive(eager_engine)
    graph_logits, graph_out = _drive(graph_engine)
    assert graph_out == eager_out
    assert len(graph_out) == 4 and len(graph_out["c"]) == 2
    _assert_same_steps(graph_logits, eager_logits)
    graphs = graph_engine.runner.decode_graphs
    assert graph_engine.runner.model.ops.launcher.replays >= 5  # most decode steps were replays
    assert len({bucket for bucket, _ in graphs.steps}) >= 3  # the batch moved through buckets
    for engine in (eager_engine, graph_engine):
        assert engine.scheduler.num_preemptions > 0
    assert graph_engine.scheduler.num_preemptions == eager_engine.scheduler.num_preemptions


def test_a_graph_mode_decode_step_is_one_launch_and_two_transfers(tmp_path):
    """An eager decode step launches 6 kernels a layer from Python (the two norms
    folded into q|k|v's and gate/up's GEMVs) and 5 a step, and copies twice: 185
    launches at SmolLM2's depth (30 layers; here 3, the count's form the same); a
    replayed step is one CUDA graph launch on a GPU with the same two copies, and
    where no graph is made (the simulator) its kernels, counted as launches. Both add
    the sampler's argmax."""
    layers = 3
    write_tiny_model(str(tmp_path), num_hidden_layers=layers, hidden_size=16, intermediate_size=16)
    per_step = {}
    for cuda_graphs in (False, True):
        engine = LLMEngine(tmp_path, EngineConfig(backend="cuda", num_blocks=8,
                                                  cuda_graphs=cuda_graphs))
        engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        engine.step()  # prefill
        engine.step()  # the first decode step (recorded, in graph mode)
        ops = engine.runner.model.ops
        before = np.array([ops.launcher.launches, ops.launcher.graph_launches, ops.launcher.replays, ops.launcher.transfers])
        engine.step()
        per_step[cuda_graphs] = tuple(np.array([ops.launcher.launches, ops.launcher.graph_launches, ops.launcher.replays,
                                                ops.launcher.transfers]) - before)
    launches = 6 * layers + 5 + 1  # (+1: the greedy sample's argmax, found on the device; only it comes back)
    assert per_step[False] == (launches, 0, 0, 2)
    assert per_step[True] == ((1, 1, 1, 2) if cuda_usable() else (launches, 0, 1, 2))


def test_a_context_growing_past_an_attention_partition_is_recorded_again(tmp_path):
    """Decode attention's grid covers a power-of-two count of keys (its split follows);
    a step whose context crosses 128 keys runs a second recording of the same bucket
    (sharing its workspace), equal to the eager step. (One narrow layer: the
    simulator's cost is the 125-token prompt's products.)"""
    write_tiny_model(str(tmp_path), max_position_embeddings=256, num_hidden_layers=1, hidden_size=16,
                     intermediate_size=16)
    runs = {}
    for cuda_graphs in (False, True):
        engine = LLMEngine(tmp_path, EngineConfig(backend="cuda", num_blocks=12,
                                                  cuda_graphs=cuda_graphs))
        logits = _record_logits(engine)
        engine.add_request(list(range(3, 128)), SamplingParams(temperature=0, max_tokens=6,
                                                               ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        runs[cuda_graphs] = logits, engine
    (eager_logits, _), (graph_logits, engine) = runs[False], runs[True]
    _assert_same_steps(graph_logits, eager_logits)
    graphs = engine.runner.decode_graphs
    assert set(graphs.steps) == {(1, 128), (1, 256)}  # up to 128 keys, then past them
    assert graphs.steps[1, 128].recording.workspace is graphs.steps[1, 256].recording.workspace
    assert engine.runner.model.ops.launcher.replays >= 2


def _eager_logits_of_five_tokens(model_dir) -> list:
    """Every step's logits of the eager engine on the capture tests' request."""
    eager = _pressure_engine(model_dir, False)
    logits = _record_logits(eager)
    eager.add_request([5, 6, 7, 8, 9], SamplingParams(temperature=0, max_tokens=6,
                                                      ignore_eos=True))
    while eager.has_unfinished():
        eager.step()
    return logits


def test_a_captured_graph_is_one_launch_and_replays_the_eager_steps(tiny_model_dir, monkeypatch):
    """Capture made to succeed on any machine (on the simulator, the "graph" replays
    the recorded launches): a replayed step counts one graph launch and no kernel
    launch from the host, and its logits equal the eager step's."""
    captured = []

    def capture(recording):
        captured.append(len(recording))
        return recording.replay
    monkeypatch.setattr(StepRecording, "_capture", capture)
    engine = _pressure_engine(tiny_model_dir, True)
    engine.runner.decode_graphs.capture = True  # (the simulator's engine would not try)
    logits = _record_logits(engine)
    engine.add_request([5, 6, 7, 8, 9], SamplingParams(temperature=0, max_tokens=6,
                                                       ignore_eos=True))
    engine.step()  # prefill
    engine.step()  # the first decode step: recorded, then captured
    ops = engine.runner.model.ops
    assert len(captured) == 1 and captured[0] > 0
    before = (ops.launcher.launches, ops.launcher.graph_launches, ops.launcher.replays)
    engine.step()
    # one graph launch, plus the greedy sample's argmax launched from the host
    assert (ops.launcher.launches - before[0], ops.launcher.graph_launches - before[1],
            ops.launcher.replays - before[2]) == (1, 1, 1)
    while engine.has_unfinished():
        engine.step()
    _assert_same_steps(logits, _eager_logits_of_five_tokens(tiny_model_dir))


def test_a_failed_capture_warns_once_and_replays_kernel_by_kernel(tiny_model_dir, monkeypatch):
    """Where a graph cannot be captured (an older numba-cuda, a driver that refuses;
    injected here, so the test holds on a GPU that can capture too), the step still
    runs, replayed launch by launch and counted so, after one warning."""
    def refuse(recording):
        raise RuntimeError("capture refused (injected)")
    monkeypatch.setattr(StepRecording, "_capture", refuse)
    engine = _pressure_engine(tiny_model_dir, True)
    engine.runner.decode_graphs.capture = True  # try, as on a GPU
    logits = _record_logits(engine)
    engine.add_request([5, 6, 7, 8, 9], SamplingParams(temperature=0, max_tokens=6,
                                                       ignore_eos=True))
    with pytest.warns(RuntimeWarning, match="CUDA graph capture failed") as warned:
        while engine.has_unfinished():
            engine.step()
    assert len([w for w in warned if "capture failed" in str(w.message)]) == 1
    ops = engine.runner.model.ops
    assert ops.launcher.replays >= 3 and ops.launcher.graph_launches == 0
    _assert_same_steps(logits, _eager_logits_of_five_tokens(tiny_model_dir))

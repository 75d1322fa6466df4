"""DecodeGraphs: decode steps recorded once per batch-size bucket, then replayed.

The first decode step at a bucket runs eagerly while the backend records its
launches (StepRecording); later steps at that bucket upload their inputs into the
bucket's fixed buffer (one transfer), launch the recording (one CUDA graph on a
GPU) and copy back the logits of the real rows (a second transfer). A verification
step (speculation.py: a decode row per proposal, each with its sequence's block table)
is a decode step too. Prefill and mixed steps stay eager.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .attention import MIN_DECODE_KEYS
from .memory import StepWorkspace, covering_keys
from .static_decode import StaticDecodeInputs, bucket_for, bucket_sizes
from .step_recording import StepRecording


@dataclass(slots=True)
class RecordedStep:
    """The step of one bucket and one span of contexts (the decode attention's grid
    follows the longest context, in powers of two: memory.covering_keys)."""
    inputs: StaticDecodeInputs  # the bucket's buffer (shared by its recordings)
    keys: int
    recording: StepRecording
    logits: object = None  # (bucket, vocab) device view the recording writes; None until recorded


class DecodeGraphs:
    def __init__(self, model, kv, max_batch: int, max_blocks: int, capture: bool):
        """model: a PagedModel on the CUDA backend; kv: its PagedKVCache. max_batch:
        the rows of the largest step recorded (the engine's max_num_seqs; times 1 +
        num_speculative_tokens when it speculates); max_blocks: max_model_len /
        block_size, rounded up.
        capture: make CUDA graphs (on a GPU); False replays launch by launch."""
        self.model, self.kv, self.ops = model, kv, model.ops
        self.buckets = bucket_sizes(max_batch)
        self.max_blocks, self.capture = max_blocks, capture
        self.inputs: dict[int, StaticDecodeInputs] = {}  # a bucket's input buffer
        self.workspaces: dict[int, StepWorkspace] = {}  # and its activations' (one step at a time)
        self.steps: dict[tuple[int, int], RecordedStep] = {}  # by (bucket, keys)

    def accepts(self, meta) -> bool:
        """A step of decode rows (one token and one logits row a span: plain decoding, or a
        verification's rows, several of one sequence) that a bucket holds."""
        rows = meta.num_tokens
        return rows <= self.buckets[-1] and len(meta.context_lens) == len(meta.logits_indices) == rows

    def run(self, token_ids: np.ndarray, meta) -> np.ndarray:
        """token_ids (B,), meta of B one-token sequences -> logits (B, vocab) on the device."""
        bucket = bucket_for(len(token_ids), self.buckets)
        keys = covering_keys(int(meta.positions.max()) + 1, MIN_DECODE_KEYS)
        step = self.steps.get((bucket, keys))
        if step is None:
            if bucket not in self.inputs:
                self.inputs[bucket] = StaticDecodeInputs(bucket, self.max_blocks,
                                                         self.model.kv_groups.num_groups)
                self.workspaces[bucket] = StepWorkspace()
            step = self.steps[bucket, keys] = RecordedStep(
                self.inputs[bucket], keys, StepRecording(self.workspaces[bucket]))
        step.inputs.upload(token_ids, meta)
        self.ops.launcher.transfers += 1
        if step.logits is None:
            self._record(step)
        else:  # counted as they happen: a graph, or its kernels launched one by one
            launches = step.recording.launch()
            self.ops.launcher.launches += launches
            self.ops.launcher.graph_launches += launches == 0
            self.ops.launcher.replays += 1
        return step.logits[:len(token_ids)]  # (the sampler takes what it needs of them)

    def _record(self, step: RecordedStep) -> None:
        """Run the step eagerly while recording it. If the recording's workspace had to
        grow midway, record again into the grown one, so that a step's activations
        live in one buffer; then capture the graph."""
        while True:
            before = step.recording.workspace.allocations
            with self.ops.recording(step.recording):
                meta = replace(step.inputs.meta, decode_keys=step.keys)
                step.logits = self.model.forward_on_device(step.inputs.token_ids, meta, self.kv)
            if step.recording.workspace.allocations == before:
                break
        if self.capture and not step.recording.capture_graph():
            self.capture = False  # (warned once: later steps do not try again)

"""ModelRunner: a planned step's forward pass: kernel inputs from the scheduled batch,
the model run over the paged KV pool, and its tokens counted as computed."""
from __future__ import annotations

import numpy as np

from ..batch.attention_metadata import AttentionMetadata
from ..batch.step_logits import WHOLE_ROW, StepLogits
from ..model.paged_model import PagedKVCache, PagedModel
from .block_manager import BlockManager
from .pooled import pooled_rows, take_pooled
from .scheduler import ScheduledBatch
from .speculation import row_spans
from .step_plan import StepPlan


class ModelRunner:
    def __init__(self, model: PagedModel, kv: PagedKVCache, block_manager: BlockManager,
                 decode_graphs=None):
        """decode_graphs: a CUDA DecodeGraphs that runs pure decode steps as recorded
        static steps (None: every step eager)."""
        self.model, self.kv, self.block_manager = model, kv, block_manager
        self.block_size = block_manager.block_size
        self.decode_graphs = decode_graphs
        self.lora = None  # the engine's LoRAAdapters, when adapters may run

    def run(self, plan: StepPlan) -> StepLogits | None:
        """The plan's forward pass; then each chunk's tokens count as computed (its full
        blocks join the prefix cache). None when there was nothing to run, or when the
        forward failed: every request in the batch has then failed (plan.outcome)."""
        if not plan:
            return None
        try:
            logits = self.forward(plan.batch, plan.rows, plan.needs(), pooled_rows(plan.chunks))
        except Exception as e:
            plan.outcome.fail_batch([seq for seq, _ in plan.batch.chunks], e)
            return None
        for chunk in plan.chunks:
            seq = chunk.seq
            if seq.is_finished:  # its request failed earlier in this loop
                continue
            try:
                seq.num_computed_tokens += chunk.tokens
                # (not a proposal's block: the sampler accepts or rolls them back)
                self.block_manager.register_full_blocks(seq, seq.num_computed_tokens - seq.num_drafts)
            except Exception as e:
                plan.outcome.fail(seq, e)
        if isinstance(logits, tuple):  # (logits, the pooled rows' states: pooled.py)
            logits = take_pooled(plan, *logits)
        return logits

    def prepare(self, batch: ScheduledBatch,
                logits_rows: list[int] | None = None) -> tuple[np.ndarray, AttentionMetadata]:
        """Flat token ids (T,) of every scheduled chunk, and their metadata (a decode
        with proposals: a decode row per token, speculation.row_spans)."""
        spans, rows = row_spans(batch.chunks, logits_rows)
        token_ids = np.concatenate([np.asarray(seq.token_ids[start:end])
                                    for seq, start, end in spans]).astype(np.int64)
        meta = AttentionMetadata.build_grouped(
            [(seq.block_tables, start, end) for seq, start, end in spans], self.block_size, rows)
        return token_ids, meta

    def forward(self, batch: ScheduledBatch, logits_rows: list[int] | None = None,
                needs: list[int] | None = None, pooled: tuple | None = None):
        """Copy-on-write copies, then the forward pass: logits (R, vocab) in batch.chunks
        order, logits_rows[i] rows for chunk i (default: one each, its last token's),
        left where the backend computed them; needs[r] says what sampling needs of row
        r (step_logits.py; None: whole rows). pooled: (head rows, pooled rows) of those
        (pooled.pooled_rows): then (StepLogits of the head rows or None, the pooled
        rows' states (P, H) on the host)."""
        ops = self.model.ops
        if batch.block_copies:
            ops.copy_blocks(self.kv.k, self.kv.v, batch.block_copies)
        token_ids, meta = self.prepare(batch, logits_rows)
        graphs, lora = self.decode_graphs, self.lora and self.lora.batch(batch.chunks)
        if graphs is not None and lora is None and pooled is None and graphs.accepts(meta):
            logits = graphs.run(token_ids, meta)
        else:  # (a step with adapters runs eager: its rows' slots change the launches)
            logits = self.model.forward_on_device(*ops.prepare_inputs(token_ids, meta), self.kv, lora=lora,
                                                  pooled_rows=pooled and tuple(map(ops.upload, pooled)))
        if pooled is not None:  # (no head row: no logits)
            logits, hidden = logits
            return (None if logits is None else ops.logits_for_sampling(logits, needs),
                    np.array(ops.to_host(hidden)))
        return ops.logits_for_sampling(logits, needs if needs is not None
                                       else [WHOLE_ROW] * logits.shape[0])

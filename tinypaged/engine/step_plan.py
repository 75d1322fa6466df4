"""StepPlan: what a scheduled batch asks of the forward pass and of sampling, per
chunk: how many rows of logits it needs, and what sampling needs of each row
(batch/step_logits.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ..batch.step_logits import NOT_NEEDED, WHOLE_ROW
from .request import Request
from .scheduler import ScheduledBatch
from .sequence import Sequence
from .step_logits import candidates_needed


@dataclass(slots=True)
class PlannedChunk:
    seq: Sequence
    tokens: int  # computed this step
    rows: int  # of logits: every token's where its prompt logprobs are wanted, else the last's
    prompt_logprobs: bool
    first_row: int  # of its rows in the step's logits


class StepPlan:
    def __init__(self, batch: ScheduledBatch, requests: dict[str, Request]):
        self.batch = batch
        self.chunks: list[PlannedChunk] = []
        row = 0
        for seq, n in batch.chunks:
            want = requests[seq.request_id].wants_prompt_logprobs
            self.chunks.append(PlannedChunk(seq, n, n if want else 1, want, row))
            row += n if want else 1

    @property
    def rows(self) -> list[int]:
        return [c.rows for c in self.chunks]

    def needs(self) -> list[int]:
        """What sampling needs of each row: whole rows for prompt logprobs, a sample's
        candidates or whole row where a token is due, nothing where a prompt goes on
        in the next step."""
        needs = []
        for c in self.chunks:
            if c.prompt_logprobs:
                needs += [WHOLE_ROW] * c.rows
            elif c.seq.num_computed_tokens + c.tokens == len(c.seq):  # (forks share the row)
                needs.append(candidates_needed(c.seq.params))
            else:
                needs.append(NOT_NEEDED)
        return needs

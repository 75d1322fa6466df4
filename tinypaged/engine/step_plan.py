"""StepPlan: one step's work as the scheduler planned it: the scheduled batch, what
each chunk asks of the forward pass and of sampling (its rows of logits, and what
sampling needs of each row: batch/step_logits.py), and the step's StepOutcome."""
from __future__ import annotations

from dataclasses import dataclass

from ..batch.step_logits import NOT_NEEDED, WHOLE_ROW
from .request import Request
from .sequence import Sequence
from .step_logits import candidates_needed
from .step_outcome import StepOutcome


@dataclass(slots=True)
class PlannedChunk:
    seq: Sequence
    tokens: int  # computed this step
    rows: int  # of logits: every token's where its prompt logprobs are wanted, else the last's
    prompt_logprobs: bool
    first_row: int  # of its rows in the step's logits
    completes: bool  # no token left to compute after it (a decode, a prompt's last chunk): a token is due
    hidden: int = 0  # rows whose states its pooling reads, after its logits rows (pooled.py)


class StepPlan:
    def __init__(self, batch, requests: dict[str, Request], outcome: StepOutcome):
        """batch: the scheduler's ScheduledBatch."""
        self.batch, self.outcome = batch, outcome
        self.chunks: list[PlannedChunk] = []
        row = 0
        for seq, n in batch.chunks:
            want = requests[seq.request_id].wants_prompt_logprobs
            completes = seq.num_computed_tokens + n == len(seq)
            # (a decode with proposals, speculation.py: a row after its token and each proposal)
            rows = 0 if seq.pooled else n if want or seq.num_drafts else 1
            hidden = seq.pooled.rows_wanted(n, seq.num_computed_tokens) if seq.pooled else 0
            self.chunks.append(PlannedChunk(seq, n, rows, want, row, completes, hidden))
            row += rows

    def __bool__(self) -> bool:
        return bool(self.batch)

    @property
    def rows(self) -> list[int]:
        """Each chunk's rows of the forward's output: its logits rows and its pooled ones."""
        return [c.rows + c.hidden for c in self.chunks]

    def needs(self) -> list[int]:
        """What sampling needs of each row: whole rows for prompt logprobs, a sample's
        candidates or whole row where a token is due, nothing where a prompt goes on
        in the next step."""
        needs = []
        for c in self.chunks:
            if c.prompt_logprobs:
                needs += [WHOLE_ROW] * c.rows
            elif c.completes:  # (forks share the row; a row after each proposal)
                needs += [candidates_needed(c.seq.params)] * c.rows
            else:
                needs += [NOT_NEEDED] * c.rows
        return needs

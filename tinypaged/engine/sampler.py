"""Sampler: a step's tokens drawn from its logits. First what each chunk's logits give
before a draw: the prompt logprobs asked for, and, where a prompt just finished, the
n - 1 other samples of its request forked (sharing the prompt's blocks). Then every
due sample's token in one batched call (with the bit masks of constrained samples),
each with its logprobs where asked."""
from __future__ import annotations

from ..batch.step_logits import StepLogits
from ..logprobs import token_logprobs
from ..outputs import TokenLogprobs
from ..structured.grammar import Grammars
from .request import Request
from .scheduler import Scheduler
from .sequence import Sequence
from .step_logits import draw_tokens
from .speculation import row_inputs
from .step_outcome import StepOutcome
from .step_plan import StepPlan


class Sampler:
    def __init__(self, requests: dict[str, Request], grammars: Grammars, scheduler: Scheduler):
        """scheduler: where forked samples join the running batch."""
        self.requests, self.grammars, self.scheduler = requests, grammars, scheduler

    def sample(self, plan: StepPlan, logits: StepLogits | None
               ) -> list[tuple[Sequence, int, TokenLogprobs | None]]:
        """(sample, token, its logprobs or None) for each sample due a token this step
        (none when the forward did not run: logits None)."""
        if logits is None:
            return []
        drawn = self._draw_all(self._due(plan, logits), logits, plan.outcome)
        spec = self.scheduler.speculation  # (what proposals earn: speculation.py)
        return drawn if spec is None else spec.settle(drawn)

    def _due(self, plan: StepPlan, logits: StepLogits) -> list[tuple[Sequence, int]]:
        """The samples due a token, each with its row of logits; prompt logprobs
        collected on the way. A failure fails that chunk's request alone."""
        due = []
        for chunk in plan.chunks:
            seq = chunk.seq
            if seq.is_finished:  # its request failed earlier in this step
                continue
            request = self.requests[seq.request_id]
            try:
                end = chunk.first_row + chunk.rows
                if chunk.prompt_logprobs:
                    self._collect_prompt_logprobs(request, logits.rows(list(range(chunk.first_row, end))),
                                                  seq.num_computed_tokens - chunk.tokens)
                if chunk.completes:  # not part-way through a prompt (with proposals: a token a row)
                    due += [(seq, row) for row in range(chunk.first_row, end)] if seq.num_drafts \
                        else [(s, end - 1) for s in self._samples_of(seq)]
                    plan.outcome.touch(seq)
            except Exception as e:
                plan.outcome.fail(seq, e)
        return due

    def _draw_all(self, due: list[tuple[Sequence, int]], logits: StepLogits,
                  outcome: StepOutcome) -> list[tuple[Sequence, int, TokenLogprobs | None]]:
        """(sample, token, its logprobs or None) for each due (sample, row of logits).
        Should the batched draw fail, each sample draws alone, so only a request whose
        own sampling fails is failed (outcome.fail) and left out. Each sample's uniform
        is drawn once, so a retry changes no seeded result."""
        uniforms = [0.0 if s.params.greedy else s.rng.random() for s, _ in due]
        try:
            tokens = self._draw(due, uniforms, logits)
        except Exception:
            tokens = []
            for i in range(len(due)):
                try:
                    tokens += self._draw(due[i:i + 1], uniforms[i:i + 1], logits)
                except Exception as e:
                    outcome.fail(due[i][0], e)
                    tokens.append(None)
        drawn = []
        for (seq, row), token in zip(due, tokens):
            if token is None or seq.is_finished:  # failed, or a sibling sample failed
                continue
            try:
                lp = None
                if seq.params.logprobs is not None:
                    lp = token_logprobs(logits.rows([row]), [token], seq.params.logprobs)[0]
                drawn.append((seq, token, lp))
            except Exception as e:
                outcome.fail(seq, e)
        return drawn

    def _draw(self, due, uniforms: list[float], logits: StepLogits) -> list[int]:
        rows = row_inputs([s for s, _ in due])  # (a proposal's row: the tokens and grammar before it)
        return draw_tokens(logits, [row for _, row in due], [s.params for s, _ in due], uniforms,
                           [(t, p) for t, p, _ in rows], self._masks([s for s, _ in due], rows))

    def _masks(self, seqs: list[Sequence], rows: list[tuple]) -> list | None:
        """Each row's allowed tokens as a bit mask row (its grammar's, less what its
        params forbid, given the output before the row: token_rules.py); None for a free
        sample, or when all are free."""
        held = [i for i, (_, _, grammar) in enumerate(rows) if grammar is not None]
        grammar_rows = dict(zip(held, self.grammars.fill_masks([rows[i][2] for i in held])))\
            if held else {}
        masks = []
        for i, (seq, (tokens, prompt, _)) in enumerate(zip(seqs, rows)):
            rules = self.requests[seq.request_id].rules
            row = grammar_rows.get(i)
            masks.append(rules.mask(tokens[prompt:], row) if rules is not None else row)
        return masks if any(m is not None for m in masks) else None

    @staticmethod
    def _collect_prompt_logprobs(request: Request, logits, first: int) -> None:
        """logits (r, V) at positions first .. first + r - 1; position j predicts prompt
        token j + 1. Positions already collected (before a preemption) are skipped."""
        ids, collected = request.prompt_token_ids, request.prompt_logprobs
        positions = [j for j in range(first, first + len(logits)) if len(collected) <= j + 1 < len(ids)]
        if positions:
            collected += token_logprobs(logits[[j - first for j in positions]],
                                        [ids[j + 1] for j in positions],
                                        request.params.prompt_logprobs)

    def _samples_of(self, seq: Sequence) -> list[Sequence]:
        """seq, and before its first token its n - 1 forks (sharing the prompt's blocks)."""
        request = self.requests[seq.request_id]
        samples = [seq]
        if seq.num_output_tokens == 0 and len(request.seqs) < seq.params.n:
            for i in range(1, seq.params.n):
                child = seq.fork(i)
                self.scheduler.block_manager.fork(seq, child)
                self.scheduler.add_forked(child)
                request.add_sample(child)
                samples.append(child)
        return samples

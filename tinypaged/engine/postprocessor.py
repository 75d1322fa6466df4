"""Postprocessor: what a step computed, applied to its sequences. Before sampling,
advance(): each chunk's tokens count as computed (its full blocks join the prefix
cache), prompt logprobs are collected, and a prompt just finished forks its n - 1
other samples; the samples due a token are returned. After sampling, append(): each
token joins its sample, which ends on EOS or a stop token (both kept in the output,
as vLLM keeps them), a stop string, a finished grammar, or its length."""
from __future__ import annotations

from ..batch.step_logits import StepLogits
from ..logprobs import token_logprobs
from ..outputs import TokenLogprobs
from .block_manager import BlockManager
from .request import Request
from .scheduler import Scheduler
from .sequence import Sequence
from .step_outcome import StepOutcome
from .step_plan import StepPlan


class Postprocessor:
    def __init__(self, requests: dict[str, Request], scheduler: Scheduler,
                 block_manager: BlockManager, eos_token_ids: set[int], max_model_len: int):
        self.requests, self.scheduler, self.block_manager = requests, scheduler, block_manager
        self.eos_token_ids, self.max_model_len = eos_token_ids, max_model_len

    def advance(self, plan: StepPlan, logits: StepLogits,
                outcome: StepOutcome) -> list[tuple[Sequence, int]]:
        """Every chunk advanced; returns the samples due a token (a prompt just
        finished, or a decode), each with its row of logits. A failure fails that
        chunk's request alone."""
        due = []
        for chunk in plan.chunks:
            seq = chunk.seq
            if seq.is_finished:  # its request failed earlier in this loop
                continue
            request = self.requests[seq.request_id]
            try:
                first = seq.num_computed_tokens
                seq.num_computed_tokens += chunk.tokens
                self.block_manager.register_full_blocks(seq, seq.num_computed_tokens)
                end = chunk.first_row + chunk.rows
                if chunk.prompt_logprobs:
                    self._collect_prompt_logprobs(request, logits.rows(list(range(chunk.first_row, end))),
                                                  first)
                if seq.num_computed_tokens == len(seq):  # not part-way through a prompt
                    due += [(s, end - 1) for s in self._samples_of(seq)]
                    outcome.touch(seq)
            except Exception as e:
                outcome.fail(seq, e)
        return due

    def append(self, drawn: list[tuple[Sequence, int, TokenLogprobs | None]],
               outcome: StepOutcome) -> None:
        for seq, token, logprobs in drawn:
            if seq.is_finished:  # a sibling's failure ended it
                continue
            try:
                self._append(seq, token, logprobs, outcome)
            except Exception as e:
                outcome.fail(seq, e)

    def _append(self, seq: Sequence, token: int, logprobs: TokenLogprobs | None,
                outcome: StepOutcome) -> None:
        params = seq.params
        text = self.requests[seq.request_id].texts[seq.sample_index]
        seq.append_token(token, logprobs)
        if token in params.stop_token_ids or (token in self.eos_token_ids and not params.ignore_eos):
            # (masks allow these only where a sample may end) An ending token is output like
            # any other, as vLLM's: in token_ids, with its logprobs, counted; a harness that
            # scores an echoed prompt drops the last token. Its text only on request.
            if params.include_stop_str_in_output:
                text.push(token)
            return outcome.finish(seq, "stop")
        grammar = seq.grammar
        if grammar is not None:
            grammar.advance(token)
        if text.push(token, self._may_end(seq)):
            return outcome.finish(seq, "stop")
        if grammar is not None and grammar.complete:
            return outcome.finish(seq, "stop")
        if (params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens) \
                or len(seq) >= self.max_model_len:
            outcome.finish(seq, "length")

    @staticmethod
    def _may_end(seq: Sequence):
        """Whether a stop string may end seq's text here (None: always): not before
        min_tokens, and only where its grammar accepts the text before it."""
        grammar, min_tokens = seq.grammar, seq.params.min_tokens
        if grammar is None and not min_tokens:
            return None
        return lambda text: (seq.num_output_tokens >= min_tokens
                             and (grammar is None or grammar.accepts(text)))

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
                self.block_manager.fork(seq, child)
                self.scheduler.add_forked(child)
                request.add_sample(child)
                samples.append(child)
        return samples

"""Postprocessor: a step's drawn tokens applied to its sequences, and the step's
outputs. Each token joins its sample, which ends on EOS or a stop token (both kept
in the output, as vLLM keeps them), a stop string, a finished grammar, or its
length; the step's figures go to EngineStats."""
from __future__ import annotations

from ..outputs import RequestOutput, TokenLogprobs
from .engine_stats import EngineStats
from .request import Request
from .scheduler import Scheduler
from .sequence import Sequence
from .step_outcome import StepOutcome
from .step_plan import StepPlan


class Postprocessor:
    def __init__(self, requests: dict[str, Request], scheduler: Scheduler, statistics: EngineStats,
                 eos_token_ids: set[int], max_model_len: int):
        self.requests, self.scheduler, self.statistics = requests, scheduler, statistics
        self.eos_token_ids, self.max_model_len = eos_token_ids, max_model_len

    def postprocess(self, plan: StepPlan, drawn: list[tuple[Sequence, int, TokenLogprobs | None]]
                    ) -> list[RequestOutput]:
        """Each drawn token appended (a sample that ends gives its blocks back), the
        step counted; returns the requests it changed, and forgets the finished ones
        (their output is returned for the last time)."""
        outcome = plan.outcome
        if plan:
            self.statistics.note_peak(self.scheduler.running)  # before the finished leave
        self.append(drawn, outcome)
        if plan:
            self.statistics.count_step(plan.batch)
            self.statistics.record_utilization(self.scheduler.running)
        outputs = [r.output() for r in outcome.touched.values()]
        for out in outputs:
            if out.finished:
                self.requests.pop(out.request_id, None)
        return outputs

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

"""SampleStep: LLMEngine's half that turns a step's logits into tokens: every due
token drawn in one batched call (with the bit masks of constrained samples), then
each appended, ending its sample on EOS or a stop token (both kept in the output, as
vLLM keeps them), a stop string, a finished grammar, or its length."""
from __future__ import annotations

from ..logprobs import token_logprobs
from ..outputs import TokenLogprobs
from .sequence import Sequence
from ..batch.step_logits import StepLogits
from .step_logits import draw_tokens


class SampleStep:
    """Mixed into LLMEngine: uses its requests, grammars, eos_token_ids,
    max_model_len, _finish and _fail_request."""

    def _sample_due(self, due: list[tuple[Sequence, int]], logits, touched: dict) -> None:
        """Draw every due token in one batch. Should that fail, each request draws
        alone, so only a request whose own sampling fails is failed. Each sample's
        uniform is drawn once, so a retry changes no seeded result."""
        uniforms = [0.0 if s.params.greedy else s.rng.random() for s, _ in due]
        try:
            tokens = self._draw(due, uniforms, logits)
        except Exception:
            tokens = []
            for i in range(len(due)):
                try:
                    tokens += self._draw(due[i:i + 1], uniforms[i:i + 1], logits)
                except Exception as e:
                    self._fail_sample(due[i][0], e, touched)
                    tokens.append(None)
        for (seq, row), token in zip(due, tokens):
            if token is None or seq.is_finished:  # failed, or a sibling sample failed
                continue
            try:
                lp = None
                if seq.params.logprobs is not None:
                    lp = token_logprobs(logits.rows([row]), [token], seq.params.logprobs)[0]
                self._append(seq, token, lp)
            except Exception as e:
                self._fail_sample(seq, e, touched)

    def _draw(self, due, uniforms: list[float], logits: StepLogits) -> list[int]:
        return draw_tokens(logits, [row for _, row in due], [s.params for s, _ in due], uniforms,
                           [(s.token_ids, s.num_prompt_tokens) for s, _ in due],
                           self._masks([s for s, _ in due]))

    def _masks(self, seqs: list[Sequence]) -> list | None:
        """Each sample's allowed tokens as a bit mask row (its grammar's, less what its
        params forbid: token_rules.py); None for a free sample, or when all are free."""
        held = [i for i, s in enumerate(seqs) if s.grammar is not None]
        grammar_rows = dict(zip(held, self.grammars.fill_masks([seqs[i].grammar for i in held])))\
            if held else {}
        masks = []
        for i, seq in enumerate(seqs):
            rules = self.requests[seq.request_id].rules
            row = grammar_rows.get(i)
            masks.append(rules.mask(seq.output_token_ids, row) if rules is not None else row)
        return masks if any(m is not None for m in masks) else None

    def _fail_sample(self, seq: Sequence, error: Exception, touched: dict) -> None:
        request = self.requests[seq.request_id]
        if request.error is None:
            self._fail_request(request, error)
        touched[seq.request_id] = request

    def _append(self, seq: Sequence, token: int, logprobs: TokenLogprobs | None) -> None:
        params = seq.params
        text = self.requests[seq.request_id].texts[seq.sample_index]
        seq.append_token(token, logprobs)
        if token in params.stop_token_ids or (token in self.eos_token_ids and not params.ignore_eos):
            # (masks allow these only where a sample may end) An ending token is output like
            # any other, as vLLM's: in token_ids, with its logprobs, counted; a harness that
            # scores an echoed prompt drops the last token. Its text only on request.
            if params.include_stop_str_in_output:
                text.push(token)
            return self._finish(seq, "stop")
        grammar = seq.grammar
        if grammar is not None:
            grammar.advance(token)
        if text.push(token, self._may_end(seq)):
            return self._finish(seq, "stop")
        if grammar is not None and grammar.complete:
            return self._finish(seq, "stop")
        if (params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens) \
                or len(seq) >= self.max_model_len:
            self._finish(seq, "length")

    @staticmethod
    def _may_end(seq: Sequence):
        """Whether a stop string may end seq's text here (None: always): not before
        min_tokens, and only where its grammar accepts the text before it."""
        grammar, min_tokens = seq.grammar, seq.params.min_tokens
        if grammar is None and not min_tokens:
            return None
        return lambda text: (seq.num_output_tokens >= min_tokens
                             and (grammar is None or grammar.accepts(text)))

"""Sampler: a step's due tokens drawn from its logits: every one in one batched call
(with the bit masks of constrained samples), each with its logprobs where asked."""
from __future__ import annotations

from ..batch.step_logits import StepLogits
from ..logprobs import token_logprobs
from ..outputs import TokenLogprobs
from ..structured.grammar import Grammars
from .request import Request
from .sequence import Sequence
from .step_logits import draw_tokens
from .step_outcome import StepOutcome


class Sampler:
    def __init__(self, requests: dict[str, Request], grammars: Grammars):
        self.requests, self.grammars = requests, grammars

    def sample(self, due: list[tuple[Sequence, int]], logits: StepLogits,
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

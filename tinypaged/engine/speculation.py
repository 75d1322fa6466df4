"""Speculation: proposals added to a step's decoding sequences (speculative_config: by
prompt lookup, ngram_proposer.py, or by a draft model, draft_proposer.py), verified in
the same step, and what the target model's tokens accept of them.

A sequence with k proposals computes k + 1 rows in the step: its last token's and
each proposal's, every one a decode row of the same kernels as plain decoding
(model_runner.py), so the target's token after each is the one plain decoding would
draw there, bit for bit. It accepts the longest prefix of proposals equal to the
target's tokens, plus the target's token after them: one to k + 1 tokens a step for
one read of the weights. Rejected proposals' slots are given back (rollback) and no
block holding an unaccepted token enters the prefix cache.

Sampling works the same way: each row's token is drawn as plain sampling would draw it
there (the same logits, the same uniform: the sequence's random stream is wound back
to the accepted tokens' draws), and a proposal is accepted when the drawn token is it.
For a proposal that is one token for sure (an n-gram's: q one-hot), that is the
rejection rule itself: accepted with probability p(token), else a token from p less
the proposal's share, renormalised; and a seeded request gives plain sampling's tokens.

Each row's penalties, bad words and min_tokens see the tokens before it (row_inputs).
A grammar's state follows the proposals too: each row's mask is the grammar's past the
proposals before it, and proposals stop at the first one the grammar refuses. Every
decoding sequence may speculate: the samples of a request (n > 1) each from their own
tokens, a shared last block copied on write for a proposal's slot as for a decode's.
"""
from __future__ import annotations

import time

from ..speculative_config import SpeculativeConfig
from .block_manager import BlockManager
from .draft_proposer import DraftProposer
from .draft_sizer import EVEN, Acceptance, DraftSizer
from .ngram_proposer import NgramProposer
from .sequence import Sequence


class Speculation:
    def __init__(self, config: SpeculativeConfig, max_model_len: int, block_manager: BlockManager,
                 proposer):
        """proposer: an NgramProposer or a DraftProposer (propose_all, rollback)."""
        self.block_manager = block_manager  # (proposals' slots taken and given back)
        self.proposer = proposer
        self.max_model_len = max_model_len
        self.sizer = DraftSizer(config.num_speculative_tokens)  # how many proposals pay
        # every sequence's verifications: a new sequence's prior where above even (one
        # that starts lower would fade back to it while idle, and never be tried again)
        self.overall = Acceptance()
        self._timing = None  # (start, rows) of a pure decode step, for the sizer
        self._streams = {}  # sampling sequence -> its random stream's state before the step's draws
        # vLLM's counts: verification passes with proposals, proposals, accepted proposals,
        # and those by position (the i-th proposal of a pass)
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.accepted_per_position = [0] * config.num_speculative_tokens

    @classmethod
    def of(cls, engine_config, max_model_len: int, block_manager: BlockManager, ops,
           tokenizer, vocab_size: int) -> "Speculation | None":
        """The engine's speculation (None where engine_config.speculative_config is),
        with its proposer: a draft model is loaded here, on the target's backend."""
        config = engine_config.speculative_config
        if config is None:
            return None
        if config.method == "ngram":
            proposer = NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min,
                                     config.prompt_lookup_max)
        else:
            proposer = DraftProposer.load(config.model, ops, tokenizer,
                                          vocab_size, max_model_len, block_manager.num_blocks,
                                          block_manager.block_size, engine_config.kv_cache_dtype,
                                          engine_config.layout_cache)
        return cls(config, max_model_len, block_manager, proposer)

    def _limit(self, seq: Sequence, most: int) -> int:
        """Proposals seq may take: at most `most`, and none that would take it past
        max_model_len or max_tokens with the target's own token after them."""
        limit = min(most, self.max_model_len - len(seq) - 1)
        if seq.params.max_tokens is not None:
            limit = min(limit, seq.params.max_tokens - seq.num_output_tokens - 1)
        return max(0, limit)

    def add_drafts(self, batch, budget: int) -> None:
        """Proposals for the batch's decoding sequences, as many as pay (DraftSizer),
        within budget tokens and as many as free blocks hold (each a slot after its
        sequence's last token)."""
        start, block_manager = time.perf_counter(), self.block_manager
        for seq in batch.decodes:
            seq.acceptance = seq.acceptance or Acceptance(max(EVEN, self.overall.rate))
        sizes = self.sizer.choose([seq.acceptance.rate for seq in batch.decodes], len(batch.decodes))
        limits = []
        for seq, size in zip(batch.decodes, sizes):
            if size == 0:
                seq.acceptance.idle()
            limits.append(min(self._limit(seq, size), max(0, budget)))
            budget -= limits[-1]
        for seq, proposals in zip(batch.decodes, self.proposer.propose_all(batch.decodes, limits)):
            grammars = [seq.grammar]  # (a grammar's state before each row: row_inputs)
            for token in proposals:
                if seq.grammar is not None and not _grammar_takes(grammars, token):
                    break  # (the grammar refuses it: its row could not draw it)
                seq.add_drafts([token])
                if not block_manager.can_append(seq):
                    seq.drop_last_draft()
                    break
                batch.block_copies += block_manager.append_slot(seq)
            if seq.grammar is not None:
                seq.draft_grammars = grammars[:seq.num_drafts + 1]
            if seq.num_drafts and not seq.params.greedy:  # (its draws are wound back in settle)
                self._streams[seq] = seq.rng.bit_generator.state
        rows = len(batch.decodes) + sum(seq.num_drafts for seq in batch.decodes)
        self._timing = None if batch.prefills else (start, rows)

    def settle(self, drawn: list[tuple]) -> list[tuple]:
        """drawn ((sample, token, logprobs) a row, the sampler's) with each speculating
        sample's rows cut to what its proposals earn: the accepted proposals' tokens and
        the target's next one. Its proposals leave its tokens; the accepted ones' slots
        stay computed, the blocks past the next token's slot go back to the pool."""
        kept, groups = [], {}
        for entry in drawn:
            seq = entry[0]
            if not seq.num_drafts:
                kept.append([entry])
            elif seq in groups:
                groups[seq].append(entry)
            else:
                groups[seq] = [entry]
                kept.append(groups[seq])
        for seq, rows in groups.items():
            drafts = seq.take_drafts()
            accepted = self.accept(drafts, [token for _, token, _ in rows])
            seq.acceptance.note(len(drafts), accepted)
            self.overall.note(len(drafts), accepted)
            seq.num_computed_tokens = len(seq) + accepted  # (the target's token: not yet)
            self.block_manager.truncate(seq, len(seq) + accepted + 1)
            self.proposer.rollback(seq, seq.num_computed_tokens)
            # the accepted proposals (their rows' logprobs), then the target's token
            rows[:] = [(seq, drafts[i], rows[i][2]) for i in range(accepted)] + [rows[accepted]]
            state = self._streams.pop(seq, None)
            if state is not None:  # the stream as plain sampling leaves it: a draw a token
                seq.rng.bit_generator.state = state
                seq.rng.random(accepted + 1)
        self._streams.clear()  # (a sequence that failed in the step)
        if self._timing is not None:  # (the forward and the draw, without the postprocessing)
            self.sizer.note_step(self._timing[1], time.perf_counter() - self._timing[0])
            self._timing = None
        return [entry for group in kept for entry in group]

    def accept(self, drafts: list[int], targets: list[int]) -> int:
        """How many of drafts the target's tokens accept: targets[i] is the target's token
        after the last token and drafts[:i]; the longest prefix where they agree."""
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
            accepted += 1
        self.num_drafts += 1
        self.num_draft_tokens += len(drafts)
        self.num_accepted_tokens += accepted
        for position in range(accepted):
            self.accepted_per_position[position] += 1
        return accepted

    def counts(self) -> tuple[int, int, int, tuple[int, ...]]:
        """(passes with proposals, proposals, accepted, accepted by position): /metrics'."""
        return (self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens,
                tuple(self.accepted_per_position))

    def as_dict(self) -> dict:
        """The counts, the acceptance rate and the mean accepted length a pass (with the
        target's own token: 1 to k + 1)."""
        return {"spec_num_drafts": self.num_drafts, "spec_num_draft_tokens": self.num_draft_tokens,
                "spec_num_accepted_tokens": self.num_accepted_tokens,
                "spec_acceptance_rate": self.num_accepted_tokens / max(1, self.num_draft_tokens),
                "spec_mean_accepted_length": 1 + self.num_accepted_tokens / max(1, self.num_drafts)}


def row_spans(chunks: list[tuple[Sequence, int]], logits_rows: list[int] | None
              ) -> tuple[list[tuple[Sequence, int, int]], list[int]]:
    """(sequence, first position, end) spans of a step's chunks and the logits rows of
    each: a chunk's span as scheduled (logits_rows[i] rows; None: one), but a decode
    with proposals one decode row per token, each attending to the keys up to its own
    position, as plain decoding computes it (and through the same kernels)."""
    spans, rows = [], []
    for i, (seq, n) in enumerate(chunks):
        start = seq.num_computed_tokens
        if seq.num_drafts:
            spans += [(seq, p, p + 1) for p in range(start, start + n)]
            rows += [1] * n
        else:
            spans.append((seq, start, start + n))
            rows.append(logits_rows[i] if logits_rows is not None else 1)
    return spans, rows


def _grammar_takes(grammars: list, token: int) -> bool:
    """Whether the grammar, past the proposals so far (grammars[-1]), takes token next:
    if so, its state past it joins grammars (a copy: each row keeps its own)."""
    following = grammars[-1].fork()
    if not following.matcher.consume_token(token) or following.matcher.is_error():
        return False
    grammars.append(following)
    return True


def row_inputs(seqs: list[Sequence]) -> list[tuple[list[int], int, object]]:
    """(tokens before the row, prompt length, grammar state or None) of each row to draw,
    the sequences in row order: a sequence's own, but the j-th row of one with proposals
    has the tokens up to its j-th proposal and the grammar past the proposals before it
    (the penalties, token rules and grammar of that row see those)."""
    out, seen = [], {}
    for seq in seqs:
        if seq.num_drafts:
            j = seen[seq] = seen.get(seq, -1) + 1
            grammar = seq.draft_grammars[j] if seq.grammar is not None else None
            out.append((seq.token_ids[:len(seq) - seq.num_drafts + j], seq.num_prompt_tokens, grammar))
        else:
            out.append((seq.token_ids, seq.num_prompt_tokens, seq.grammar))
    return out

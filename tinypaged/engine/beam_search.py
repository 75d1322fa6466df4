"""Beam search over the paged pool: beams fork block tables, so every beam shares its
ancestors' blocks; the slot a beam writes is copied first when it is shared
(copy-on-write); a pruned beam's blocks go back to the pool at once."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..kernels.reference import log_softmax
from ..sampling import SamplingParams
from .block_manager import blocks_for
from .scheduler import ScheduledBatch
from .sequence import Sequence


@dataclass(slots=True)
class Beam:
    token_ids: list[int]  # ending with its EOS where it ended so
    cum_logprob: float  # sum of the log-probabilities of token_ids
    score: float  # cum_logprob / length ** length_penalty: what beams are ranked by
    finish_reason: str  # "stop" (EOS) or "length"
    text: str = ""


@dataclass(slots=True)
class BeamSearchOutput:
    prompt: str | None
    prompt_token_ids: list[int]
    beams: list[Beam]  # best first
    peak_blocks: int = 0  # most KV blocks the search held at once
    peak_blocks_unshared: int = 0  # what the same beams would hold without sharing
    stats: dict = field(default_factory=dict)


class BeamSearch:
    """One prompt's search. `step()` advances every live beam by one token."""

    def __init__(self, engine, prompt_ids: list[int], beam_width: int, max_tokens: int,
                 length_penalty: float, ignore_eos: bool):
        self.engine, self.bm = engine, engine.block_manager
        self.width, self.max_tokens = beam_width, max_tokens
        self.length_penalty, self.ignore_eos = length_penalty, ignore_eos
        self.finished: list[Beam] = []
        self.prompt_ids = prompt_ids
        self.peak_blocks = self.peak_unshared = 0
        root = Sequence("beam", prompt_ids, SamplingParams(temperature=0, max_tokens=max_tokens))
        if not self.bm.can_allocate(root):
            raise ValueError("the KV pool has no room for this prompt's beam search")
        self.bm.allocate(root)
        self.bm.register_full_blocks(root, len(root))
        self.live: list[tuple[Sequence, float]] = [(root, 0.0)]
        try:
            self.logits = self._run(ScheduledBatch(prefills=[(root, root.num_uncomputed_tokens)]))
        except BaseException:
            self.release()
            raise

    def _run(self, batch: ScheduledBatch) -> np.ndarray:
        step_logits = self.engine.runner.forward(batch)
        logits = step_logits.rows(list(range(len(step_logits))))  # (every row is used)
        for seq, n in batch.chunks:
            seq.num_computed_tokens += n
            self.bm.register_full_blocks(seq, seq.num_computed_tokens)
        self.engine.statistics.note_peak([s for s, _ in self.live])
        used = self.bm.num_blocks - self.bm.num_free_blocks
        unshared = sum(self.bm.num_groups * blocks_for(len(s), self.bm.block_size)
                       for s, _ in self.live)
        self.peak_blocks, self.peak_unshared = max(self.peak_blocks, used), max(self.peak_unshared, unshared)
        return logits

    def _score(self, cum_logprob: float, length: int) -> float:
        return cum_logprob / max(length, 1) ** self.length_penalty

    @property
    def done(self) -> bool:
        return not self.live

    def step(self) -> None:
        logprobs = log_softmax(self.logits.astype(np.float64))  # (beams, vocab)
        n_out = self.live[0][0].num_output_tokens + 1  # output length after this step
        per_beam = min(2 * self.width, logprobs.shape[1])
        candidates = []  # (cum logprob, beam index, token)
        for i, (seq, cum) in enumerate(self.live):
            top = np.argpartition(-logprobs[i], per_beam - 1)[:per_beam]
            candidates += [(cum + logprobs[i, t], i, int(t)) for t in top]
        candidates.sort(key=lambda c: -c[0])
        chosen = []
        for rank, (cum, i, token) in enumerate(candidates):
            if token in self.engine.eos_token_ids and not self.ignore_eos:
                if rank < self.width:  # an EOS among the best candidates ends a beam
                    out = self.live[i][0].output_token_ids  # (the EOS kept, as by sampling)
                    self.finished.append(Beam([*out, token], cum, self._score(cum, n_out), "stop"))
                continue
            chosen.append((cum, i, token))
            if len(chosen) == self.width:
                break

        parents, self.live = self.live, []
        for cum, i, token in chosen:  # forked before the parents are freed: blocks stay shared
            child = parents[i][0].fork(len(self.live))
            self.bm.fork(parents[i][0], child)
            child.append_token(token)
            self.live.append((child, cum))
        for parent, _ in parents:  # pruned beams give their blocks back now
            self.bm.free(parent)

        if not self.live or n_out >= self.max_tokens or len(self.finished) >= self.width:
            for seq, cum in self.live:
                self.finished.append(Beam(seq.output_token_ids, cum, self._score(cum, n_out), "length"))
                self.bm.free(seq)
            self.live = []
            return
        copies = []
        for seq, _ in self.live:
            self.bm.release_behind(seq)  # (sliding layers' blocks behind their window)
            if not self.bm.can_append(seq):
                self.release()
                raise ValueError(f"the KV pool is too small for beam_width={self.width}")
            copies += self.bm.append_slot(seq)  # a shared last block is copied, never written
        self.logits = self._run(ScheduledBatch(decodes=[s for s, _ in self.live], block_copies=copies))

    def release(self) -> None:
        """Give every live beam's blocks back (the search is over or failed); blocks
        hashed for tokens that were never computed leave the prefix cache."""
        for seq, _ in self.live:
            self.bm.forget_uncomputed(seq)
            self.bm.free(seq)
        self.live = []

    def best(self) -> list[Beam]:
        beams = sorted(self.finished, key=lambda b: -b.score)[:self.width]
        for beam in beams:  # a character cut short at the end is left out of the text, and EOS
            ids = beam.token_ids[:-1] if beam.finish_reason == "stop" else beam.token_ids
            beam.text = self.engine.tokenizer.continuation(self.prompt_ids, ids).rstrip("\ufffd")
        return beams


def run_beam_searches(engine, prompts: list, prompt_ids: list[list[int]], beam_width: int,
                      max_tokens: int, length_penalty: float,
                      ignore_eos: bool) -> list[BeamSearchOutput]:
    """One search per prompt, in turn, on an engine with nothing else running. On any
    failure the live beams' blocks go back before the exception leaves."""
    assert not engine.has_unfinished(), "beam search needs the engine to itself"
    results = []
    for prompt, ids in zip(prompts, prompt_ids):
        budget = min(max_tokens, engine.max_model_len - len(ids))
        search = BeamSearch(engine, ids, beam_width, budget, length_penalty, ignore_eos)
        try:
            while not search.done:
                search.step()
        finally:
            search.release()
        results.append(BeamSearchOutput(prompt if isinstance(prompt, str) else None, ids,
                                        search.best(), search.peak_blocks, search.peak_unshared))
    return results

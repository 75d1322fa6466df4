"""Scheduler: continuous batching over a waiting queue and a running list.

Each step has a budget of max_num_batched_tokens tokens:
1. every running sequence with one token left to compute (decoding) gets a slot
   for it, preempting the most recently admitted sequences when the pool runs dry;
2. running sequences part-way through their prompt (chunked prefill) take their
   next chunk from what is left of the budget;
3. waiting sequences are admitted first-come first-served while the budget,
   max_num_seqs and the free blocks allow; a prompt longer than what is left is
   started with a chunk and continued in later steps, between other sequences'
   decode steps;
4. with speculation on, decoding sequences take proposals from what budget and free
   blocks are left (speculation.py): k more tokens each to verify in this step.
A preempted sequence gives back all its blocks and waits at the front of the
queue; on readmission it is recomputed (its prompt and output so far are its new
prefill, mostly found again in the prefix cache).

Bookkeeping costs nothing per waiting sequence: an aborted waiting sequence is
marked finished and dropped when it reaches the head of the queue (the queue is
compacted once half of it is dead), and the counts a server reads are kept as
sequences come and go.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..outputs import KV_CACHE_FULL
from .block_manager import BlockManager
from .request import Request
from .sequence import Sequence, SequenceStatus
from .speculation import Speculation
from .step_outcome import StepOutcome
from .step_plan import StepPlan


@dataclass(slots=True)
class ScheduledBatch:
    prefills: list[tuple[Sequence, int]] = field(default_factory=list)  # (seq, tokens this step)
    decodes: list[Sequence] = field(default_factory=list)  # compute the one token left
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst)
    out_of_memory: list[Sequence] = field(default_factory=list)  # cannot grow even alone

    @property
    def chunks(self) -> list[tuple[Sequence, int]]:
        """Every scheduled sequence with its number of tokens (a decode's: 1 and its
        proposals), in batch order."""
        return self.prefills + [(seq, 1 + seq.num_drafts) for seq in self.decodes]

    def __bool__(self) -> bool:
        return bool(self.prefills or self.decodes)


def seats(seq: Sequence) -> int:
    """Places in the running batch (max_num_seqs) a sequence holds: a first sample
    before its first token holds one for each of the request's n samples, since its
    n - 1 forks join the batch when its prompt is done, without being admitted."""
    return seq.params.n if seq.sample_index == 0 and seq.num_output_tokens == 0 else 1


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int,
                 max_num_batched_tokens: int, requests: dict[str, Request],
                 speculation: Speculation | None = None):
        """requests: the engine's, by id (a plan reads what each request asks of a step).
        speculation: proposals for decoding sequences (None: off)."""
        self.block_manager, self.requests, self.speculation = block_manager, requests, speculation
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()  # may hold aborted (finished) sequences
        self.running: list[Sequence] = []  # in admission order: the last is preempted first
        self.num_waiting = 0  # unfinished sequences in `waiting`
        self.waiting_seats = 0  # the places they will take in the running batch (seats())
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self._enqueue(seq)

    def has_unfinished(self) -> bool:
        return bool(self.num_waiting or self.running)

    def _enqueue(self, seq: Sequence, front: bool = False) -> None:
        (self.waiting.appendleft if front else self.waiting.append)(seq)
        self.num_waiting += 1
        self.waiting_seats += seats(seq)

    def _head(self) -> Sequence | None:
        """The first unfinished waiting sequence (aborted ones before it are dropped)."""
        while self.waiting and self.waiting[0].is_finished:
            self.waiting.popleft()
        return self.waiting[0] if self.waiting else None

    def _dequeue_head(self) -> Sequence:
        seq = self.waiting.popleft()
        self.num_waiting -= 1
        self.waiting_seats -= seats(seq)
        return seq

    def schedule(self) -> StepPlan:
        """The next step's plan (StepPlan over the ScheduledBatch that schedule_batch
        picks); a sequence the pool cannot hold even alone finishes now."""
        batch = self.schedule_batch()
        plan = StepPlan(batch, self.requests, StepOutcome(self.requests, self))
        for seq in batch.out_of_memory:
            plan.outcome.finish(seq, KV_CACHE_FULL)
        return plan

    def schedule_batch(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        bm = self.block_manager
        budget = self.max_num_batched_tokens
        preemptions_before = self.num_preemptions

        # 0. in KV groups whose layers slide, blocks behind the window go back to the pool
        for seq in self.running:
            bm.release_behind(seq)

        # 1. decoding sequences (one token left) need a slot; make room by preemption
        kept: list[Sequence] = []
        queue = list(self.running)
        while queue:
            seq = queue.pop(0)
            if seq.num_uncomputed_tokens > 1:  # mid-prompt: holds blocks for all its tokens
                kept.append(seq)
                continue
            while not bm.can_append(seq):
                if queue:
                    self._preempt(queue.pop())
                elif kept:
                    self._preempt(kept.pop())
                else:  # alone and still no room: the pool cannot hold it any longer
                    batch.out_of_memory.append(seq)
                    break
            else:
                batch.block_copies += bm.append_slot(seq)
                kept.append(seq)
        # A sequence preempted after it got its slot may leave a copy-on-write pair behind:
        # copying into a block nobody reads yet is harmless, and pairs run in order.
        self.running = kept
        batch.decodes = [seq for seq in kept if seq.num_uncomputed_tokens == 1]
        budget -= len(batch.decodes)

        # 2. sequences part-way through their prompt take their next chunk
        for seq in self.running:
            if seq.num_uncomputed_tokens > 1 and budget > 0:
                budget -= self._schedule_chunk(batch, seq, budget)

        # 3. admit waiting sequences first-come first-served (none if we just preempted)
        seats_taken = sum(seats(seq) for seq in self.running)
        while budget > 0 and self.num_preemptions == preemptions_before:
            seq = self._head()
            if seq is None or seats_taken + seats(seq) > self.max_num_seqs \
                    or not bm.can_allocate(seq):
                break
            self._dequeue_head()
            bm.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            seats_taken += seats(seq)
            budget -= self._schedule_chunk(batch, seq, budget)

        # 4. proposals for decoding sequences, from what is left
        if self.speculation is not None:
            self.speculation.add_drafts(batch, budget)
        return batch

    def _schedule_chunk(self, batch: ScheduledBatch, seq: Sequence, budget: int) -> int:
        """Schedule the next min(left, budget) prompt tokens of seq; their full blocks
        enter the prefix cache now (see BlockManager.register_full_blocks)."""
        n = min(seq.num_uncomputed_tokens, budget)
        self.block_manager.register_full_blocks(seq, seq.num_computed_tokens + n)
        batch.prefills.append((seq, n))
        return n

    def _preempt(self, seq: Sequence) -> None:  # (before proposals: step 4 comes after)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        self._enqueue(seq, front=True)
        self.num_preemptions += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire seq at once: its blocks go back to the pool (and its unverified
        proposals leave its tokens)."""
        seq.take_drafts()
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.block_manager.free(seq)
        if seq in self.running:
            self.running.remove(seq)

    def add_forked(self, seq: Sequence) -> None:
        """A sample forked from a running sequence joins the running batch."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def abort(self, seqs: list[Sequence], reason: str = "abort") -> list[Sequence]:
        """Finish every unfinished sequence of seqs (one request's), returning their
        blocks; the ones that were waiting leave the queue when they reach its head."""
        gone = [seq for seq in seqs if not seq.is_finished]
        for seq in gone:
            if seq.status == SequenceStatus.WAITING:
                self.num_waiting -= 1
                self.waiting_seats -= seats(seq)
            self.finish(seq, reason)
        if len(self.waiting) > 2 * self.num_waiting + 64:  # mostly dead: compact (amortized O(1))
            self.waiting = deque(seq for seq in self.waiting if not seq.is_finished)
        return gone

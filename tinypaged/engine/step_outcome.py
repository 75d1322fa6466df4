"""StepOutcome: what one engine step did to its requests, and the one way a request
ends inside a step (finished, or failed alone while the others go on)."""
from __future__ import annotations

from .request import Request
from .sequence import Sequence


class StepOutcome:
    def __init__(self, requests: dict[str, Request], scheduler):
        self.requests, self.scheduler = requests, scheduler
        self.touched: dict[str, Request] = {}  # request id -> request, in the order touched

    def touch(self, seq: Sequence) -> Request:
        request = self.requests[seq.request_id]
        self.touched[seq.request_id] = request
        return request

    def finish(self, seq: Sequence, reason: str) -> None:
        """seq ends now ("stop", "length", KV_CACHE_FULL): its blocks go back to the pool."""
        self.scheduler.finish(seq, reason)
        self.touch(seq).texts[seq.sample_index].finish()

    def fail(self, seq: Sequence, error: Exception) -> None:
        """seq's request fails with error (the first error wins): every sample of it
        ends with finish_reason "error", its blocks freed."""
        request = self.touch(seq)
        if request.error is None:
            request.error, request.aborted = error, True
            for sample in self.scheduler.abort(request.seqs, "error"):
                request.texts[sample.sample_index].finish()

    def fail_batch(self, seqs: list[Sequence], error: Exception) -> None:
        """The forward pass over seqs failed: each of their requests fails. Blocks hashed
        for this step's tokens hold garbage, so they leave the prefix cache first."""
        for seq in seqs:
            self.scheduler.block_manager.forget_uncomputed(seq)
        for seq in seqs:
            self.fail(seq, error)

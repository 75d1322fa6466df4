"""LoopMetrics: what a server reports about the engine loop: request gauges, token
and cache counters, and latency histograms (time to first token, inter-token
latency, end-to-end latency), kept as vLLM defines them.

The loop thread writes; any thread may take a snapshot().
"""
from __future__ import annotations

import bisect
import dataclasses
import threading
from collections import Counter
from dataclasses import dataclass, field

from ..outputs import RequestOutput
from .output_stream import RequestStream

# Bucket upper bounds in seconds, as vLLM's histograms use (so dashboards line up).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(init=False)  # per bucket (not cumulative), + the +Inf one
    total: float = 0.0
    count: int = 0

    def __post_init__(self):
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.observe_many((value,))

    def observe_many(self, values) -> None:
        counts, bounds = self.counts, self.bounds
        for value in values:
            counts[bisect.bisect_left(bounds, value)] += 1
            self.total += value
            self.count += 1

    def copy(self) -> "Histogram":
        h = Histogram(self.bounds)
        h.counts, h.total, h.count = list(self.counts), self.total, self.count
        return h


@dataclass(slots=True)
class MetricsSnapshot:
    running: int = 0  # requests with a sequence in the running batch
    waiting: int = 0  # requests queued, not yet running (or preempted)
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, found
    preemptions: int = 0
    # speculation (None: off): passes with proposals, proposals, accepted, accepted by position
    spec: tuple[int, int, int, tuple[int, ...]] | None = None
    prompt_tokens: int = 0  # prompt tokens of requests that produced a first token
    generation_tokens: int = 0
    finished: Counter = field(default_factory=Counter)  # finish reason -> requests
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of KV blocks in use."""
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


class LoopMetrics:
    def __init__(self):
        self._lock = threading.Lock()
        self._m = MetricsSnapshot()

    def observe(self, stream: RequestStream, out: RequestOutput, now: float) -> None:
        """Account one output of a request (loop thread)."""
        self.observe_step([(stream, out)], now)

    def observe_step(self, pairs: list[tuple[RequestStream, RequestOutput]], now: float) -> None:
        """Account one step's outputs (loop thread): one lock for the whole step."""
        ttft, itl, e2e = [], [], []
        with self._lock:
            m = self._m
            for stream, out in pairs:
                samples = out.outputs
                tokens = (len(samples[0].token_ids) if len(samples) == 1
                          else sum(len(o.token_ids) for o in samples))
                if tokens > stream.num_tokens_seen:
                    if stream.first_token_time is None:
                        stream.first_token_time = now
                        ttft.append(now - stream.arrival)
                        m.prompt_tokens += len(out.prompt_token_ids)
                    else:
                        itl.append(now - stream.last_token_time)
                    m.generation_tokens += tokens - stream.num_tokens_seen
                    stream.num_tokens_seen, stream.last_token_time = tokens, now
                if out.finished:
                    e2e.append(now - stream.arrival)
                    m.finished[samples[0].finish_reason or "abort"] += 1
            m.ttft.observe_many(ttft)
            m.itl.observe_many(itl)
            m.e2e.observe_many(e2e)

    def set_engine_state(self, running: int, waiting: int, blocks_used: int, blocks_total: int,
                         prefix_queries: int, prefix_hits: int, preemptions: int,
                         spec: tuple | None = None) -> None:
        with self._lock:
            m = self._m
            m.running, m.waiting = running, waiting
            m.kv_blocks_used, m.kv_blocks_total = blocks_used, blocks_total
            m.prefix_cache_queries, m.prefix_cache_hits = prefix_queries, prefix_hits
            m.preemptions, m.spec = preemptions, spec

    def num_waiting(self) -> int:
        with self._lock:
            return self._m.waiting

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            m = self._m
            return dataclasses.replace(m, finished=Counter(m.finished), ttft=m.ttft.copy(),
                                       itl=m.itl.copy(), e2e=m.e2e.copy())

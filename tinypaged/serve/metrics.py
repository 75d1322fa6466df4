"""GET /metrics: the engine loop's figures in Prometheus' text format, under vLLM's
metric names, so dashboards built for vLLM read them unchanged."""
from __future__ import annotations

from collections import Counter

from ..engine.loop_metrics import Histogram, MetricsSnapshot
from .openai_format import openai_finish_reason

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _labels(model: str, **extra: str) -> str:
    pairs = {"model_name": model, **extra}
    escaped = (f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
               for k, v in pairs.items())
    return "{" + ",".join(escaped) + "}"


def _openai_reasons(finished: Counter) -> Counter:
    """Finish reasons as the API reports them (kv_cache_full counts as length)."""
    out = Counter()
    for reason, count in finished.items():
        out[openai_finish_reason(reason)] += count
    return out


def _sample(name: str, kind: str, help_text: str, lines: list[str]) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *lines]


def _histogram(name: str, help_text: str, h: Histogram, model: str) -> list[str]:
    lines, cumulative = [], 0
    for bound, count in zip((*h.bounds, float("inf")), h.counts):
        cumulative += count
        le = "+Inf" if bound == float("inf") else repr(float(bound))
        lines.append(f"{name}_bucket{_labels(model, le=le)} {cumulative}")
    lines += [f"{name}_sum{_labels(model)} {h.total!r}", f"{name}_count{_labels(model)} {h.count}"]
    return _sample(name, "histogram", help_text, lines)


def render(m: MetricsSnapshot, model: str) -> str:
    label = _labels(model)

    def one(name: str, kind: str, help_text: str, value) -> list[str]:
        return _sample(name, kind, help_text, [f"{name}{label} {value}"])

    out = []
    out += one("vllm:num_requests_running", "gauge", "Requests in the running batch.", m.running)
    out += one("vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", m.waiting)
    out += one("vllm:kv_cache_usage_perc", "gauge", "Fraction of KV-cache blocks in use (1 = all).",
               repr(float(m.kv_cache_usage)))
    out += one("tinypaged:kv_blocks_used", "gauge", "KV-cache blocks in use.", m.kv_blocks_used)
    out += one("tinypaged:kv_blocks_total", "gauge", "KV-cache blocks in the pool.", m.kv_blocks_total)
    out += one("vllm:prefix_cache_queries_total", "counter",
               "Prompt tokens looked up in the prefix cache.", m.prefix_cache_queries)
    out += one("vllm:prefix_cache_hits_total", "counter",
               "Prompt tokens found in the prefix cache.", m.prefix_cache_hits)
    out += one("vllm:num_preemptions_total", "counter", "Sequences preempted for want of blocks.",
               m.preemptions)
    out += one("vllm:prompt_tokens_total", "counter", "Prompt tokens of requests served.",
               m.prompt_tokens)
    out += one("vllm:generation_tokens_total", "counter", "Tokens generated.", m.generation_tokens)
    if m.spec is not None:  # speculative decoding (vLLM's spec_decode counters)
        drafts, proposed, accepted, by_position = m.spec
        out += one("vllm:spec_decode_num_drafts_total", "counter",
                   "Verification passes with proposals.", drafts)
        out += one("vllm:spec_decode_num_draft_tokens_total", "counter", "Tokens proposed.", proposed)
        out += one("vllm:spec_decode_num_accepted_tokens_total", "counter",
                   "Proposed tokens accepted.", accepted)
        out += _sample("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
                       "Proposed tokens accepted, by their position in the pass.",
                       [f"vllm:spec_decode_num_accepted_tokens_per_pos_total"
                        f"{_labels(model, position=str(i))} {n}" for i, n in enumerate(by_position)])
    out += _sample("vllm:request_success_total", "counter", "Requests finished, by finish reason.",
                   [f"vllm:request_success_total{_labels(model, finished_reason=reason)} {count}"
                    for reason, count in sorted(_openai_reasons(m.finished).items())])
    out += _histogram("vllm:time_to_first_token_seconds", "Time to first token in seconds.",
                      m.ttft, model)
    out += _histogram("vllm:inter_token_latency_seconds", "Time between output tokens in seconds.",
                      m.itl, model)
    out += _histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency in seconds.",
                      m.e2e, model)
    return "\n".join(out) + "\n"

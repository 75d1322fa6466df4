"""ServerConfig: the HTTP server's own knobs (the engine's are EngineConfig's)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # when set, /v1/* needs "Authorization: Bearer <key>"
    served_model_name: str | None = None  # None: the model folder's name
    # False: any `model` a request names is served (the one model there is, as llama-server
    # does; apps hard-code "gpt-4o-mini"); True: another name gets 404 model_not_found
    strict_model_name: bool = False
    max_waiting: int = 1024  # queued sequences (prompts x n) beyond which new requests get 503
    max_prompts_per_request: int = 256  # a longer batch gets 400 (a quarter of the queue at most)
    max_body_bytes: int = 4 << 20  # larger request bodies get 413
    # token positions x (1 + alternatives) that logprobs may make one response describe
    # (echo: the prompt's positions in every choice too); more gets 400
    max_logprob_entries: int = 1 << 18
    shutdown_timeout: float = 10.0  # seconds in-flight requests get to finish on SIGTERM
    max_connections: int = 1024  # beyond, a new one replaces the idlest, or gets 503 if none is idle
    header_timeout: float = 10.0  # seconds a request's headers may take to arrive
    body_timeout: float = 30.0  # seconds its body may take after the headers
    warm_up: bool = True  # one short request at start; /health says 503 "loading" until it ends
    # rendering, tokenizing and compiling grammars run in threads (workers.py): this many
    # per pool (one pool for text, one for grammars; as many processes for large text
    # work), each job within work_budget seconds (else 400) after waiting at most
    # work_queue_timeout for a thread (else 503)
    worker_threads: int = 2
    work_budget: float = 10.0
    work_queue_timeout: float = 30.0

    def __post_init__(self):
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port!r} must be in [0, 65535]")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty")
        if not isinstance(self.max_waiting, int) or self.max_waiting < 1:
            raise ValueError(f"max_waiting={self.max_waiting!r} must be an integer >= 1")
        if not isinstance(self.max_prompts_per_request, int) or self.max_prompts_per_request < 1:
            raise ValueError(f"max_prompts_per_request={self.max_prompts_per_request!r} must be "
                             f"an integer >= 1")
        if not isinstance(self.max_logprob_entries, int) or self.max_logprob_entries < 1:
            raise ValueError(f"max_logprob_entries={self.max_logprob_entries!r} must be an "
                             f"integer >= 1")
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes={self.max_body_bytes!r} must be at least 1024")
        if not isinstance(self.max_connections, int) or self.max_connections < 1:
            raise ValueError(f"max_connections={self.max_connections!r} must be an integer >= 1")
        if not isinstance(self.worker_threads, int) or self.worker_threads < 1:
            raise ValueError(f"worker_threads={self.worker_threads!r} must be an integer >= 1")
        for name in ("header_timeout", "body_timeout", "work_budget", "work_queue_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be > 0 seconds")
        if not self.shutdown_timeout >= 0:
            raise ValueError(f"shutdown_timeout={self.shutdown_timeout!r} must be >= 0 seconds")

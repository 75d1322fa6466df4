"""The server's warm-up: one short request as it starts, so that every kernel a
request needs is compiled (or read from numba's cache: a first run compiles for tens
of seconds) before /health says ok and a load balancer sends traffic; and, where
llguidance is installed, its view of the tokenizer built (0.3 s holding the GIL for a
49,152-token vocabulary, which the first structured request paid with /health
stalled); and the text worker processes started (text_processes.py). Requests that
arrive meanwhile are queued as usual; they wait for the compile, as they would have."""
from __future__ import annotations

import threading
import time

from ..llm import LLM
from ..sampling import SamplingParams
from ..structured import StructuredOutputs
from ..structured.available import StructuredOutputsUnavailable
from .errors import log
from .text_processes import TextWork

PROMPT_TOKENS = 16  # a prefill of several rows (the products' GEMM, prefill attention)


def start_warm_up(llm: LLM, ready: threading.Event, text: TextWork | None = None) -> threading.Thread:
    """Runs one greedy request of PROMPT_TOKENS tokens and 2 generated (prefill, then a
    decode step), and one more on a LoRA adapter where one is loaded, on a daemon thread; ready is set when it ends, whether it worked or
    not (a failure is logged: the requests after it meet the engine's own error)."""

    def run() -> None:
        started = time.perf_counter()
        try:
            prompt = [i % llm.tokenizer.vocab_size for i in range(1, PROMPT_TOKENS + 1)]
            if llm.config.embedding_only:  # (an embedding model: its prefill alone)
                llm.embed([prompt])
            else:  # (with a LoRA adapter beside the base where one is loaded: its kernels too)
                loaded = list(llm.engine.loras.loaded)
                llm.generate([prompt] * (1 + bool(loaded)), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
                             lora=[None] + loaded[:1])
            if text is not None:
                text.start()
            try:
                llm.compile_constraint(StructuredOutputs(json_object=True))
            except StructuredOutputsUnavailable:  # (without the structured extra)
                pass
            log.info("warm-up done in %.1f s: ready", time.perf_counter() - started)
        except Exception as e:
            log.error("warm-up failed after %.1f s: %s: %s", time.perf_counter() - started,
                      type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="tinypaged-warm-up", daemon=True)
    thread.start()
    return thread

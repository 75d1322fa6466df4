"""LLM: the library entry point (vLLM-like): generate, stream, chat, beam search, stats,
from any number of threads or asyncio tasks at once.

Every request runs through the paged engine: one preallocated KV pool, block
tables, prefix sharing and continuous batching. One background thread (the
EngineLoop) owns the engine; every method here only hands it requests and waits
for their outputs, so requests from different callers join the same batch.
"""
from __future__ import annotations

import os
import time
import weakref
from typing import AsyncIterator, Iterator

import numpy as np

from .config import EngineConfig
from .formats.gguf import GGUFFile
from .model.pooling import Pooling, pooling_of
from .engine.beam_search import BeamSearchOutput, run_beam_searches
from .engine.engine_loop import EngineLoop
from .engine.llm_engine import LLMEngine
from .engine.loop_metrics import MetricsSnapshot
from .engine.pooled import SCORE_POOLING, head_logits
from .engine.request import PreparedRequest
from . import checks
from .interrupts import finalize_keeping_interrupts, start_redelivery
from .outputs import RequestOutput
from .prompts import as_prompt_list, is_single_prompt
from .pull import default_gguf
from .rerank import answer_ids, rerank_prompt
from .request_handle import RequestHandle, async_text_deltas, text_deltas
from .lora_request import LoRARequest
from .sampling import SamplingParams


class LLM:
    def __init__(self, model: str | os.PathLike | None = None, **engine_options):
        """model: a HF model folder or a GGUF file; None = the default SmolLM2, from its
        GGUF file (Q4_1, pulled if missing).
        engine_options: EngineConfig's fields (config.py: each with its default and
        meaning); an unknown one is a TypeError."""
        start = time.perf_counter()
        config = EngineConfig(**engine_options)  # unknown options are a TypeError
        self.model_dir = os.fspath(model) if model is not None else os.fspath(default_gguf())
        # Only the loop's thread may touch the engine once requests run through this LLM.
        self.engine = LLMEngine(self.model_dir, config)
        self.tokenizer = self.engine.tokenizer
        self.config = self.engine.model_config
        self._loop = EngineLoop(self.engine)
        self._pooling = None  # (read on first use: pooling)
        # the thread ends with the LLM; the collector's call only tells it to (never waits)
        self._finalizer = weakref.finalize(self, finalize_keeping_interrupts, self._loop.stop)
        start_redelivery()  # (for an interrupt that lands in a finalizer: interrupts.py)
        self.load_seconds = time.perf_counter() - start

    # -- one request -------------------------------------------------------------
    def prepare(self, prompt: str | list[int], params: SamplingParams | None = None,
                lora: str | LoRARequest | None = None) -> PreparedRequest:
        """Check a request and tokenize its prompt, without queueing it (ValueError if bad).
        lora: the LoRA adapter it runs (a loaded one's name, or a LoRARequest)."""
        return self.engine.prepare_request(prompt, params, self._adapter_name(lora))

    def compile_constraint(self, structured_outputs) -> None:
        """Compile a StructuredOutputs' grammar now (it is cached), so that requests
        that use it start at once; GrammarFailed (a ValueError) naming the problem.
        While it compiles, the engine's steps leave it a core (EngineLoop.lend_core)."""
        with self._loop.lend_core():
            self.engine.grammars.compile(structured_outputs)

    def submit(self, prompt: str | list[int] | PreparedRequest, params: SamplingParams | None = None,
               request_id: str | None = None, lora: str | LoRARequest | None = None) -> RequestHandle:
        """Queue one request (or a prepared one) and return at once; bad input raises
        ValueError here."""
        if request_id is not None:
            checks.text("request_id", request_id)
        if not isinstance(prompt, PreparedRequest):
            prompt = self.prepare(prompt, params, lora)
        elif params is not None or lora is not None:
            raise ValueError("a prepared request carries its own SamplingParams and adapter")
        return self._submit(prompt, request_id)

    def _submit(self, prepared: PreparedRequest, request_id: str | None = None) -> RequestHandle:
        return RequestHandle(self._loop, self._loop.submit(prepared, request_id))

    def abort(self, request_id: str) -> None:
        """Stop a request from any thread; its blocks are free before the next step."""
        self._loop.abort(request_id)

    def abort_all(self) -> None:
        """Stop every queued or running request (their callers get finish_reason "abort")."""
        self._loop.abort_all()

    # -- many prompts, blocking or awaited -----------------------------------------
    def _submit_all(self, prompts, params, lora=None) -> list[RequestHandle]:
        """Check every prompt first (nothing runs if one is bad), then queue them all as
        one (the engine schedules them together). lora: one adapter for all, or a list
        of one per prompt."""
        prompts = as_prompt_list(prompts)
        loras = lora if isinstance(lora, (list, tuple)) else [lora] * len(prompts)
        if len(loras) != len(prompts):
            raise ValueError(f"{len(loras)} LoRA adapters for {len(prompts)} prompts")
        loras = [self._adapter_name(a) for a in loras]
        if params is None or isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        elif not isinstance(params, (list, tuple)):
            raise TypeError(f"params must be a SamplingParams or a list of them, got "
                            f"{type(params).__name__}")
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
        prepared = []
        for i, (prompt, p, a) in enumerate(zip(prompts, params, loras)):
            try:
                prepared.append(self.engine.prepare_request(prompt, p, a))
            except (ValueError, TypeError) as e:
                if len(prompts) == 1:
                    raise
                raise type(e)(f"prompt {i}: {e}") from None
        return [RequestHandle(self._loop, stream)
                for stream in self._loop.submit_all(prepared, [None] * len(prepared))]

    def generate(self, prompts: str | list[int] | list[str] | list[list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False, lora_request: LoRARequest | list | None = None, *,
                 params=None, lora: str | list | None = None) -> list[RequestOutput]:
        """Run every prompt to completion, batched with whatever else runs; outputs in
        prompt order. A bad prompt raises ValueError naming it, before anything runs;
        if the call fails or is interrupted, its unfinished requests are aborted.
        vLLM's signature: sampling_params (params= is this API's older name for it);
        use_tqdm shows a progress bar of finished prompts when tqdm is installed.
        lora_request (vLLM's) or lora (a loaded adapter's name): the LoRA adapter the
        prompts run, or a list of one per prompt (None: the base model)."""
        handles = self._submit_all(prompts, _one_of(sampling_params, params), _lora_of(lora_request, lora))
        try:
            return [h.result() for h in _progress(handles, use_tqdm)]
        finally:
            for h in handles:
                h._abort_unfinished()

    async def agenerate(self, prompts, sampling_params=None, lora_request=None, *, params=None,
                        lora=None) -> list[RequestOutput]:
        """generate() for asyncio: awaits the outputs without blocking the event loop."""
        handles = self._submit_all(prompts, _one_of(sampling_params, params), _lora_of(lora_request, lora))
        try:
            return [await h.aresult() for h in handles]
        finally:
            for h in handles:
                h._abort_unfinished()

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None,
               lora: str | LoRARequest | None = None) -> Iterator[str]:
        """Text deltas of one request as they are generated (never half a UTF-8
        character, never part of a stop string). Everything is checked here, at the
        call, before the iterator is returned. Closing the iterator (or dropping it)
        aborts the request."""
        return text_deltas(self.submit(*self._streamable(prompt, params), lora=lora))

    def astream(self, prompt: str | list[int], params: SamplingParams | None = None,
                lora: str | LoRARequest | None = None) -> AsyncIterator[str]:
        """stream() for asyncio: `async for delta in llm.astream(...)`."""
        return async_text_deltas(self.submit(*self._streamable(prompt, params), lora=lora))

    @staticmethod
    def _streamable(prompt, params: SamplingParams | None) -> tuple:
        """stream() follows one prompt and one sample; refuse what it cannot follow."""
        if not is_single_prompt(prompt):
            raise ValueError(f"stream() follows one prompt, got a list of {len(prompt)}: use "
                             f"generate(), or one stream() per prompt")
        if isinstance(params, SamplingParams) and params.n > 1:
            raise ValueError(f"stream() follows one sample, and n={params.n}: use submit() "
                             f"and read every sample from its outputs")
        return prompt, params

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = False, lora_request: LoRARequest | list | None = None, *,
             params=None, tools: list[dict] | None = None, lora=None) -> list[RequestOutput]:
        """One conversation, or a list of them, through the model's chat template: a
        list of outputs, one per conversation (vLLM's LLM.chat). tools: OpenAI's
        function definitions, for the template to show the model."""
        return self.generate(self._conversation_ids(messages, tools),
                             _one_of(sampling_params, params), use_tqdm, lora_request, lora=lora)

    async def achat(self, messages, sampling_params=None, lora_request=None, *, params=None,
                    tools: list[dict] | None = None, lora=None) -> list[RequestOutput]:
        return await self.agenerate(self._conversation_ids(messages, tools),
                                    _one_of(sampling_params, params), lora_request, lora=lora)

    def _conversation_ids(self, messages, tools) -> list[list[int]]:
        many = isinstance(messages, (list, tuple)) and bool(messages) and \
            all(isinstance(m, (list, tuple)) for m in messages)
        return [self.chat_prompt_ids(m, tools) for m in (messages if many else [messages])]

    def chat_prompt(self, messages: list[dict]) -> str:
        """The conversation as the model's chat template renders it (text that holds the
        template's special tokens: pass chat_prompt_ids' ids to generate, which adds no
        second BOS)."""
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    def chat_prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """chat_prompt's text as token ids, encoded without adding special tokens; tools
        (OpenAI's function definitions) go to the template, which writes them where
        the model expects them."""
        return self.tokenizer.chat_ids(messages, add_generation_prompt=True, tools=tools)

    def beam_search(self, prompts: str | list[int] | list[str] | list[list[int]], beam_width: int,
                    max_tokens: int = 64, length_penalty: float = 1.0,
                    ignore_eos: bool = False) -> list[BeamSearchOutput]:
        """The beam_width best continuations of each prompt by cumulative log-probability
        (ranked by cum_logprob / length ** length_penalty). Beams share blocks. The
        search has the engine to itself: it starts when the running requests are
        done, and requests that arrive meanwhile wait for it."""
        beam_width = checks.integer("beam_width", beam_width, 1)
        max_tokens = checks.integer("max_tokens", max_tokens, 1)
        length_penalty = checks.number("length_penalty", length_penalty)
        ignore_eos = checks.boolean("ignore_eos", ignore_eos)
        prompts = as_prompt_list(prompts)
        ids = [self.engine.prompt_ids(p) for p in prompts]  # reject bad input first
        return self._loop.call(lambda: run_beam_searches(
            self.engine, prompts, ids, beam_width, max_tokens, length_penalty, ignore_eos),
            exclusive=True)

    # -- LoRA adapters ---------------------------------------------------------------
    def load_lora(self, name: str, path: str | os.PathLike) -> None:
        """Load the PEFT adapter folder at path under name, for requests that name it
        (lora=name); read and checked here, put in a slot between two steps. Needs
        enable_lora=True (or lora_modules); a ValueError names what does not fit."""
        adapter = self.engine.loras.read(name, os.fspath(path))
        self._loop.call(lambda: self.engine.loras.install(name, adapter))

    def unload_lora(self, name: str) -> None:
        """Forget adapter `name` (KeyError if none): new requests naming it are refused,
        those already running finish with it."""
        self._loop.call(lambda: self.engine.loras.unload(name))

    def list_loras(self) -> dict[str, str]:
        """Loaded adapters: name -> folder."""
        return self._loop.call(lambda: {a.name: a.path for a in self.engine.loras.loaded.values()})

    def _adapter_name(self, lora: str | LoRARequest | None) -> str | None:
        """An adapter's name; a LoRARequest's is loaded from its path the first time."""
        if not isinstance(lora, LoRARequest):
            return lora
        loaded = self.engine.loras.loaded.get(lora.lora_name)
        if loaded is None:
            try:
                self.load_lora(lora.lora_name, lora.lora_path)
            except ValueError:
                if lora.lora_name not in self.engine.loras.loaded:  # (not a second thread's load)
                    raise
        elif lora.lora_path and os.path.abspath(lora.lora_path) != os.path.abspath(loaded.path):
            raise ValueError(f"LoRA adapter {lora.lora_name!r} is loaded from {loaded.path!r}, "
                             f"not {lora.lora_path!r}")
        return lora.lora_name

    # -- embeddings --------------------------------------------------------------
    def embed(self, prompts: str | list[int] | list[str] | list[list[int]],
              dimensions: int | None = None) -> list[np.ndarray]:
        """One embedding (H,) float32 per prompt (a text or token ids): its hidden states
        pooled as the model says (`pooling`). The prompts are requests of the continuous
        batch like any other, prefilled beside whatever runs and never decoded
        (engine/pooled.py). dimensions: the first that many values, for a model trained
        for shorter embeddings (Pooling.shortened). If the call fails or is interrupted,
        its unfinished requests are aborted."""
        prompts = as_prompt_list(prompts)
        pooling, width = self.pooling, self.config.hidden_size
        pooling.shortened(np.zeros(width, np.float32), dimensions, width)  # (refused before work)
        vectors = self._pooled([self.engine.prompt_ids(p) for p in prompts], pooling)
        return [pooling.shortened(v, dimensions, width) for v in vectors]

    def score(self, query: str, documents: list[str], instruction: str | None = None) -> list[float]:
        """Each document's relevance to the query in [0, 1], as a Qwen3-Reranker-style
        model gives it (rerank.py: its prompt, then "yes" against "no" at the last
        token), in the documents' order. The prompts are requests of the continuous
        batch, as embed's are (their last token's states, then the head for the two
        answers: engine/pooled.py)."""
        checks.text("query", query)
        if isinstance(documents, str) or not documents:
            raise ValueError("documents must be a non-empty list of texts")
        yes, no = answer_ids(self.tokenizer)
        ids = [self.engine.prompt_ids(rerank_prompt(query, checks.text("document", d), instruction))
               for d in documents]
        states = np.stack(self._pooled(ids, SCORE_POOLING))
        answers = self._loop.call(lambda: head_logits(self.engine.runner.model, states, (yes, no)))
        return [float(1 / (1 + np.exp(float(n) - float(y)))) for y, n in answers]

    def _pooled(self, prompts: list[list[int]], pooling: Pooling) -> list[np.ndarray]:
        """Each prompt's pooled vector: requests of the continuous batch, prefilled beside
        whatever runs and never decoded. If the call fails or is interrupted, its
        unfinished requests are aborted."""
        prepared = [PreparedRequest(None, ids, EMBEDDING_PARAMS, pooling=pooling)
                    for ids in prompts]  # (bad input refused here, before any is queued)
        handles = [RequestHandle(self._loop, stream)
                   for stream in self._loop.submit_all(prepared, [None] * len(prepared))]
        try:
            return [h.result().embedding for h in handles]
        finally:
            for h in handles:
                h._abort_unfinished()

    @property
    def pooling(self) -> Pooling:
        """How embed() pools (model/pooling.py): sentence-transformers' modules beside
        the weights, a GGUF file's pooling_type, else the last token's, normalized."""
        if self._pooling is None:
            metadata = GGUFFile.open(self.model_dir).metadata \
                if self.model_dir.lower().endswith(".gguf") else None
            self._pooling = pooling_of(self.model_dir, metadata)
        return self._pooling

    # -- state -----------------------------------------------------------------------
    def stats(self) -> dict:
        """The pool and cache figures (read on the loop's thread, between steps)."""
        return self._loop.call(self.engine.stats)

    def metrics(self) -> MetricsSnapshot:
        """Request gauges, token counters and latency histograms (for /metrics)."""
        return self._loop.metrics.snapshot()

    @property
    def max_model_len(self) -> int:
        """Prompt + output tokens a request may hold."""
        return self.engine.max_model_len

    @property
    def is_alive(self) -> bool:
        """False once closed, or after an internal error stopped the engine loop."""
        return self._loop.is_alive

    @property
    def num_waiting(self) -> int:
        """Requests queued and not yet running."""
        return self._loop.num_waiting

    @property
    def num_waiting_samples(self) -> int:
        """Sequences queued and not yet running (a request of n samples counts n)."""
        return self._loop.num_waiting_samples

    def block_map(self, peak: bool = False) -> str:
        """A picture of the KV pool: now, or (peak=True) when it held the most blocks."""
        engine = self.engine
        return self._loop.call(lambda: engine.statistics.peak_block_map if peak else engine.block_map())

    def close(self) -> None:
        """Stop the engine loop and wait for it; unfinished requests are aborted. Later
        calls raise."""
        self._finalizer.detach()
        self._loop.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _one_of(sampling_params, params):
    """sampling_params (vLLM's name) or params (this API's older one), not both."""
    if sampling_params is not None and params is not None:
        raise TypeError("give sampling_params or params, not both")
    return sampling_params if sampling_params is not None else params


EMBEDDING_PARAMS = SamplingParams(max_tokens=1, temperature=0)  # (an embedding samples nothing)


def _lora_of(lora_request, lora):
    """lora_request (vLLM's name) or lora, not both."""
    if lora_request is not None and lora is not None:
        raise TypeError("give lora_request or lora, not both")
    return lora_request if lora_request is not None else lora


def _progress(handles: list, use_tqdm):
    """handles, wrapped in a tqdm bar when asked for and tqdm is there (vLLM's use_tqdm)."""
    if not use_tqdm or len(handles) < 2:
        return handles
    try:
        from tqdm import tqdm
    except ImportError:
        return handles
    return tqdm(handles, desc="Processed prompts") if use_tqdm is True else use_tqdm(handles)

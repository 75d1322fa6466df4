"""EngineClient: what the HTTP routes need from the engine, and nothing more: check a
request against the model (turning mistakes into 400s), refuse work when the queue
is full (503), submit, and read outputs as they come."""
from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

from ..engine.engine_loop import EngineDeadError
from ..engine.request import PreparedRequest
from ..llm import LLM
from ..outputs import RequestOutput
from ..request_handle import RequestHandle
from ..sampling import SamplingParams
from ..structured import GrammarFailed
from .config import ServerConfig
from .errors import APIError, log, shown
from .openai_format import openai_finish_reason
from .text_processes import TextWork
from .workers import WorkerPool

PARAM_IN_MESSAGE = re.compile(r"^(\w+)[=:]")


@dataclass(slots=True)
class RequestLog:
    """What the log says of one API request: a line when it ends, its failure's cause."""
    label: str  # the X-Request-Id and the response id
    started: float = field(default_factory=time.monotonic)
    constraint_param: str | None = None  # the field that constrains the output

    def finished(self, outputs: list[RequestOutput]) -> None:
        """One info line: prompts, tokens, time, finish reasons (or that the client left)."""
        prompt = sum(len(out.prompt_token_ids) for out in outputs)
        completion = sum(len(o.token_ids) for out in outputs for o in out.outputs)
        reasons = sorted({openai_finish_reason(o.finish_reason) or "none"
                          for out in outputs for o in out.outputs})
        log.info("request %s: %d prompt%s, %d prompt + %d completion tokens in %.3f s, "
                 "finish: %s", self.label, len(outputs), "" if len(outputs) == 1 else "s",
                 prompt, completion, time.monotonic() - self.started,
                 ", ".join(reasons) or "none")

    def left(self) -> None:
        """The client went away before the end: its requests were aborted."""
        log.info("request %s: the client left after %.3f s; aborted", self.label,
                 time.monotonic() - self.started)

    def failed(self, error: Exception) -> APIError:
        """The error for a request that failed in the engine: a 400 where its grammar
        went over a limit (one log line), else a 500 (the cause, with its traceback, to
        the log)."""
        if isinstance(error, GrammarFailed):
            log.warning("request %s: its grammar failed: %s", self.label, error)
            field = self.constraint_param or "structured_outputs"
            return APIError(400, f"{field}: {str(error).removeprefix('structured_outputs: ')}",
                            param=field)
        log.error("request %s failed in the engine: %r", self.label, error, exc_info=error)
        return APIError(500, f"generation failed: {error}")


class EngineClient:
    def __init__(self, llm: LLM, config: ServerConfig):
        self.llm, self.config = llm, config
        file_name = llm.model_dir.rstrip("/").split("/")[-1]
        self.model_name = config.served_model_name or file_name.removesuffix(".gguf")
        # templates, tokenizing and grammars off the event loop (workers.py)
        self.text_work = WorkerPool("text", config.worker_threads, config.work_budget,
                                    config.work_queue_timeout)
        self.grammar_work = WorkerPool("grammar", config.worker_threads, config.work_budget,
                                       config.work_queue_timeout)
        # in those threads, large text work goes on in child processes (text_processes.py)
        self.text = TextWork(llm.tokenizer, llm.model_dir, config.worker_threads,
                             config.work_budget)

    def close(self) -> None:
        """Stop the worker threads and the text processes (the server's end)."""
        self.text.close()
        self.text_work.close()
        self.grammar_work.close()

    async def prepare_all(self, prompts: list, params: SamplingParams, max_tokens: int | None,
                          prompt_param: str, constraint_param: str | None = None
                          ) -> list[PreparedRequest]:
        """prepare() for each prompt, in the worker threads: the constraint's grammar
        compiled first in the grammar pool (then the prompts find it in the cache)."""
        if params.structured_outputs is not None:
            await self.grammar_work.run(
                lambda: self.compile_constraint(params.structured_outputs, constraint_param),
                "compiling the grammar", constraint_param)
        return await self.text_work.run(
            lambda: [self.prepare(p, params, max_tokens, prompt_param, constraint_param)
                     for p in prompts], "tokenizing the prompt", prompt_param)

    def compile_constraint(self, structured, constraint_param: str | None) -> None:
        try:
            self.llm.compile_constraint(structured)
        except (ValueError, TypeError) as e:
            message = str(e).removeprefix("structured_outputs: ")
            field = constraint_param or "structured_outputs"
            raise APIError(400, f"{field}: {message}", param=field) from None

    def check_model(self, name: str | None) -> str | None:
        """The LoRA adapter a request's model names (None: the base model). Any other
        name serves the base model, unless strict_model_name (responses always name
        the model that answered)."""
        if name is not None and name in self.llm.engine.loras.loaded:
            return name
        if self.config.strict_model_name and name is not None and name != self.model_name:
            raise APIError(404, f"the model {shown(name)} does not exist; this server has "
                                f"{self.model_name!r}", param="model", code="model_not_found")
        return None

    def served_name(self, name: str | None) -> str:
        """The model a response names: the adapter the request ran, else the base."""
        return name if name is not None and name in self.llm.engine.loras.loaded else self.model_name

    def check_alive(self) -> None:
        if not self.llm.is_alive:
            raise APIError(500, "the engine has stopped; restart the server")

    def prepare(self, prompt: str | list[int], params: SamplingParams, max_tokens: int | None,
                prompt_param: str, constraint_param: str | None = None) -> PreparedRequest:
        """Tokenize and check one prompt (and compile its constraint, which the field
        constraint_param gave); max_tokens None means up to the context."""
        try:
            if isinstance(prompt, str) and prompt:
                text, prompt = prompt, self.text.encode(prompt, max_model_len=self.llm.max_model_len)
                prepared = dataclasses.replace(self.llm.prepare(prompt, params), prompt=text)
            else:
                prepared = self.llm.prepare(prompt, params)
        except (ValueError, TypeError) as e:
            error = self._bad_request(str(e), prompt_param)
            if error.param == "structured_outputs" and constraint_param is not None:
                error.param = constraint_param
            raise error from None
        room = self.llm.max_model_len - len(prepared.prompt_token_ids)
        if max_tokens is None:
            max_tokens = room
        elif max_tokens > room:
            raise APIError(400, f"this model's context is {self.llm.max_model_len} tokens: the "
                                f"prompt has {len(prepared.prompt_token_ids)} and max_tokens asks for "
                                f"{max_tokens} more", param="max_tokens",
                           code="context_length_exceeded")
        return dataclasses.replace(prepared, params=dataclasses.replace(params, max_tokens=max_tokens))

    @staticmethod
    def _bad_request(message: str, prompt_param: str) -> APIError:
        if "max_model_len" in message or "KV blocks" in message:
            return APIError(400, message, param=prompt_param, code="context_length_exceeded")
        match = PARAM_IN_MESSAGE.match(message)
        return APIError(400, message, param=match.group(1) if match else prompt_param)

    def check_logprob_entries(self, prepared: list[PreparedRequest], echo: bool,
                              param: str) -> None:
        """logprobs multiply what a response holds: every position of every choice
        (with echo, the prompt's too) carries 1 + k entries. Bounded before any work."""
        k = prepared[0].params.logprobs
        if k is None:
            return
        positions = sum(p.params.n * (p.params.max_tokens + (len(p.prompt_token_ids) if echo else 0))
                        for p in prepared)
        entries, limit = positions * (1 + k), self.config.max_logprob_entries
        if entries > limit:
            raise APIError(400, f"this request could return {entries:,} logprob entries "
                                f"({positions:,} token positions{' with the echoed prompts' if echo else ''}"
                                f" x (1 + {k} alternatives)); this server builds at most "
                                f"{limit:,} per request: ask for fewer prompts, samples, "
                                f"tokens or alternatives", param=param)

    def submit(self, prepared: list[PreparedRequest], response_id: str,
               lora: str | None = None) -> list[RequestHandle]:
        """Queue every prompt of one API request, or none: 503 when the sequences it adds
        (prompts x n) would take the queue past max_waiting, 400 when they alone would.
        lora: the adapter they run (check_model's)."""
        self.check_alive()
        prepared = [dataclasses.replace(p, lora=lora) for p in prepared] if lora else prepared
        adding = sum(p.params.n for p in prepared)
        limit = self.config.max_waiting
        if adding > limit:
            raise APIError(400, f"this request asks for {adding} sequences ({len(prepared)} "
                                f"prompts x n={prepared[0].params.n}); this server queues at "
                                f"most {limit}", param="n" if len(prepared) == 1 else "prompt")
        waiting = self.llm.num_waiting_samples
        if waiting + adding > limit:
            raise APIError(503, f"the server is busy ({waiting} sequences are waiting, and this "
                                f"request adds {adding}; the limit is {limit}); retry later",
                           code="server_overloaded", headers={"Retry-After": "1"})
        handles = []
        try:
            for i, p in enumerate(prepared):
                handles.append(self.llm.submit(p, request_id=f"{response_id}-{i}"))
        except EngineDeadError as e:
            for h in handles:
                h.abort()
            raise APIError(500, str(e)) from None
        return handles

    @staticmethod
    async def results(handles: list[RequestHandle], record: RequestLog) -> list[RequestOutput]:
        """Every request's final output; a failed request is a 500 naming the failure
        (whose cause, with its traceback, goes to the log)."""
        try:
            outputs = [await h.aresult() for h in handles]
        except Exception as e:
            for h in handles:
                h.abort()
            raise record.failed(e) from None
        record.finished(outputs)
        return outputs

    @staticmethod
    async def updates(handles: list[RequestHandle]) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(prompt index, newest snapshot) from several requests as they come. Leaving
        early (the client went away) aborts every unfinished one."""
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, handle: RequestHandle) -> None:
            try:
                async for out in handle:
                    queue.put_nowait((i, out, None))
            except Exception as e:  # the request failed: the stream reports it
                queue.put_nowait((i, None, e))

        tasks = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(handles)]
        try:
            left = len(tasks)
            while left:
                i, out, error = await queue.get()
                if error is not None:
                    raise error
                yield i, out
                left -= out.finished
        finally:
            for task in tasks:
                task.cancel()
            for handle in handles:
                handle.abort()

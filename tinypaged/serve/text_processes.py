"""The server's text work (chat templates rendered, prompts tokenized, token ids
decoded) done in child processes when the input is large, away from the engine.

In the server's own process that work competes with the engine's step: a template
renders in Python, holding the GIL the engine loop needs between kernels, and
tokenizing 4 MB is seconds of a core that numba's threads were using (a step runs at
the pace of its slowest thread). On two cores, other clients' completions ran 25x
slower beside a 3,000-message render in a thread, 8x beside a 4 MB tokenize. A child
process has its own GIL and runs at a lower priority (nice 10), so the engine's
threads come first: the same work slowed them by 1.05-1.12x (bench/NOTES.md).

Inputs under INLINE_CHARS are done in the calling thread: their work (a millisecond)
costs less than the trip. Each child loads the model's tokenizer once; children are
forked from a server process that has imported tinypaged already (multiprocessing's
forkserver), so a start costs about the tokenizer's load. A call past its budget
kills its child (a process, unlike a thread, can be stopped) and a fresh one takes
its place.
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading

from ..tokenizer import Tokenizer
from .errors import log

INLINE_CHARS = 8192  # characters (or token ids) of input done in the calling thread
NICENESS = 10  # the children's: the engine's threads come first
START_SECONDS = 120.0  # for a child to load the tokenizer (a busy machine is slow)
MESSAGE_CHARS = 64  # what one message adds to a conversation's size, beyond its own


class WorkCutOff(ValueError):
    """A job went past its budget, or its process stopped under it: the input costs too much."""


class TextWork:
    """encode, decode and chat_ids as the model's Tokenizer does them, large inputs in
    at most `processes` children, each call within `budget` seconds."""

    def __init__(self, tokenizer: Tokenizer, model_path: str, processes: int, budget: float):
        self.tokenizer, self.model_path, self.budget = tokenizer, model_path, budget
        self._idle: queue.Queue[_Child] = queue.Queue()
        self._lock = threading.Lock()
        self._slots = processes  # children that may still be started
        self._closed = False

    def encode(self, text: str, add_special_tokens: bool = True,
               max_model_len: int | None = None) -> list[int]:
        if not isinstance(text, str) or len(text) <= INLINE_CHARS:
            return self.tokenizer.encode(text, add_special_tokens, max_model_len)
        self.tokenizer.check_fits(text, max_model_len)  # (here: no copy to a child for it)
        return self._call("encode", text, add_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if len(ids) <= INLINE_CHARS // 4:
            return self.tokenizer.decode(ids, skip_special_tokens)
        return self._call("decode", list(ids), skip_special_tokens)

    def chat_ids(self, messages: list[dict], add_generation_prompt: bool = True,
                 tools: list[dict] | None = None, max_model_len: int | None = None) -> list[int]:
        if conversation_size(messages, tools) <= INLINE_CHARS:
            return self.tokenizer.chat_ids(messages, add_generation_prompt, tools, max_model_len)
        return self._call("chat_ids", messages, add_generation_prompt, tools, max_model_len)

    def start(self) -> None:
        """Start every child now (the warm-up), rather than at the first large input."""
        started = []
        with self._lock:
            while self._slots > 0 and not self._closed:
                self._slots -= 1
                started.append(_Child(self.model_path))
        for child in started:
            try:
                child.wait_ready(START_SECONDS)
            except Exception as e:
                self._retire(child)
                log.error("a text worker process did not start: %s", e)
            else:
                self._idle.put(child)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        while True:
            try:
                self._idle.get_nowait().kill()
            except queue.Empty:
                return

    def _call(self, method: str, *args):
        child = self._take()
        try:
            reply = child.call((method, args), self.budget)
        except TimeoutError:
            self._retire(child)
            raise WorkCutOff(f"{WHAT[method]} took more than {self.budget:g} s; cut off") from None
        except (EOFError, OSError):
            self._retire(child)
            log.error("a text worker process stopped (exit code %s) while %s",
                      child.process.exitcode, WHAT[method])
            raise WorkCutOff(f"{WHAT[method]} stopped its worker process (exit code "
                             f"{child.process.exitcode}); the input is too large") from None
        self._give_back(child)
        if reply[0] == "ok":
            return reply[1]
        _, kind, message = reply
        raise (TypeError if kind == "TypeError" else ValueError)(message)

    def _take(self) -> "_Child":
        """An idle child, or a new one while fewer than `processes` exist; else wait for
        one (the text pool's threads are as many as the children: a wait is short)."""
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            if self._closed:
                raise RuntimeError("the server is shutting down")
            start = self._slots > 0
            self._slots -= start
        if not start:
            try:
                return self._idle.get(timeout=self.budget + START_SECONDS)
            except queue.Empty:
                raise RuntimeError("no text worker process came free") from None
        child = _Child(self.model_path)
        try:
            child.wait_ready(START_SECONDS)
        except Exception:
            self._retire(child)
            raise
        return child

    def _give_back(self, child: "_Child") -> None:
        with self._lock:
            closed = self._closed
        if closed:  # (close() found it busy)
            child.kill()
        else:
            self._idle.put(child)

    def _retire(self, child: "_Child") -> None:
        child.kill()
        with self._lock:
            self._slots += 1


WHAT = {"encode": "tokenizing", "decode": "detokenizing", "chat_ids": "rendering the chat template"}


def conversation_size(messages, tools) -> int:
    """About how many characters a conversation (and its tools) renders to."""
    if not isinstance(messages, (list, tuple)):
        return 0  # (the tokenizer's own check names the problem)
    return sum(MESSAGE_CHARS + len(repr(m)) for m in messages) + (len(repr(tools)) if tools else 0)


def _context():
    """Forked from a clean server (it imported tinypaged, started no thread) where the
    system has one; spawned elsewhere."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
        return context
    return multiprocessing.get_context("spawn")


class _Child:
    def __init__(self, model_path: str):
        context = _context()
        self.conn, their_end = context.Pipe()
        self.process = context.Process(target=serve_text, args=(their_end, model_path),
                                       name="tinypaged-text", daemon=True)
        self.process.start()
        their_end.close()

    def wait_ready(self, timeout: float) -> None:
        if not self.conn.poll(timeout):
            raise TimeoutError(f"a text worker process did not start in {timeout:g} s")
        reply = self.conn.recv()
        if reply[0] != "ready":
            raise RuntimeError(f"a text worker process could not load the tokenizer: {reply[1]}")

    def call(self, request: tuple, timeout: float) -> tuple:
        self.conn.send(request)
        if not self.conn.poll(timeout):
            raise TimeoutError
        return self.conn.recv()

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()


def serve_text(conn, model_path: str) -> None:
    """A child's life: load the tokenizer, then answer (method, args) until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl+C is the server's to handle)
    if hasattr(os, "nice"):
        os.nice(NICENESS)
    try:
        tokenizer = Tokenizer(model_path)
    except Exception as e:
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    methods = {"encode": tokenizer.encode, "decode": tokenizer.decode, "chat_ids": tokenizer.chat_ids}
    conn.send(("ready",))
    while True:
        try:
            method, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = ("ok", methods[method](*args))
        except (ValueError, TypeError) as e:
            reply = ("error", "TypeError" if isinstance(e, TypeError) else "ValueError", str(e))
        except Exception as e:  # e.g. MemoryError: the message, never a traceback
            reply = ("error", "ValueError", f"{type(e).__name__}: {e}")
        conn.send(reply)

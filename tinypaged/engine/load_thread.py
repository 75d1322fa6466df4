"""Loading a model's weights on a short-lived thread of its own.

numba's OpenMP layer gives every thread that runs a parallel kernel a team of worker
threads, kept until that thread ends, and while two teams exist every parallel call
wakes its team more slowly. Loading runs parallel kernels (K-quant unpacking, the
lanes layout); run in the caller's thread, it left a second team beside the engine
loop's, and every later decode step ran ~40% slower (Qwen3-0.6B-shaped batch 1:
21 against 37 tokens/s; bench/NOTES.md). Here the team ends with the thread.
"""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def on_own_thread(fn: Callable[[], T]) -> T:
    """fn() run on a new thread, waited for; its result, or its exception raised here."""
    return started_on_own_thread(fn)()


def started_on_own_thread(fn: Callable[[], T]) -> Callable[[], T]:
    """fn() started on a new thread; returns the wait for it, which gives fn's result or
    raises its exception (the caller does other work meanwhile, and must wait)."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as e:  # handed to the caller, whatever it is
            outcome["error"] = e
    thread = threading.Thread(target=run, name="tinypaged-load", daemon=True)
    thread.start()

    def wait() -> T:
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]
    return wait

"""Finalizers that never swallow a Ctrl+C.

Python runs __del__ methods, weakref finalizers and the cleanup of a dropped
generator wherever the collector happens to be, and an exception raised in them is
printed and dropped ("Exception ignored in ..."). A KeyboardInterrupt is raised
wherever the main thread is when the signal is handled, so one that lands inside
such a finalizer would be lost: the user's Ctrl+C would do nothing.

Ours therefore do one small thing that never waits (post a message to the engine
loop) through finalize_keeping_interrupts. Should the interrupt land there, the
message is posted all the same and the interrupt is sent again, by a helper
thread: raising it from the finalizer itself would only raise it inside the
finalizer once more, where it would be dropped again. The helper needs the GIL
to send it, which it gets only once the main thread has moved on (Python hands
the GIL over every few milliseconds, and a finalizer takes microseconds); should
it land in another of our finalizers, that one sends it again in turn.
"""
from __future__ import annotations

import _thread
import queue
import signal
import threading

_requests: queue.SimpleQueue = queue.SimpleQueue()  # put() is reentrant: fine in a finalizer
_helper: threading.Thread | None = None
_helper_lock = threading.Lock()


def start_redelivery() -> None:
    """Start the helper thread (once; not from a finalizer: starting a thread waits)."""
    global _helper
    with _helper_lock:
        if _helper is None:
            _helper = threading.Thread(target=_redeliver_forever, name="tinypaged-interrupts",
                                       daemon=True)
            _helper.start()


def finalize_keeping_interrupts(cleanup) -> None:
    """cleanup() (idempotent and quick) to its end; a KeyboardInterrupt that lands in
    it is sent to the main thread again once the finalizer is over."""
    interrupted = False
    while True:
        try:
            cleanup()
            break
        except KeyboardInterrupt:
            interrupted = True
    if interrupted:
        _requests.put(True)


def _redeliver_forever() -> None:
    while _requests.get():
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):  # Python's handler (or the app's): a real signal, which
            # also wakes a main thread that is blocked by then
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        else:
            _thread.interrupt_main()

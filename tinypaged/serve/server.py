"""Running the app under uvicorn, with a clean end on SIGINT or SIGTERM.

On a signal uvicorn stops accepting connections and lets in-flight responses run.
After shutdown_timeout seconds every request still running is aborted: its
stream ends with finish_reason "abort" and [DONE], and its client gets a whole
response. The engine loop is closed last, and the process exits with status 0
(plain uvicorn would re-raise the signal after its shutdown).
"""
from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import resource
import signal
import socket
import threading
from typing import Callable

import uvicorn

from ..llm import LLM
from .app import build_app
from .config import ServerConfig
from .connections import ConnectionLimits, LogThrottle, limited_protocol
from .errors import log as server_log
from .warmup import start_warm_up

DESCRIPTOR_RESERVE = 64  # open files besides connections: the model, logs, the engine's


class Server(uvicorn.Server):
    """uvicorn's server, except that a handled SIGINT/SIGTERM is not raised again, and
    that requests outliving the grace period are aborted rather than cancelled."""

    def __init__(self, config: uvicorn.Config, llm: LLM, grace: float, throttle: LogThrottle):
        super().__init__(config)
        self.llm, self.grace, self.throttle = llm, grace, throttle

    async def startup(self, sockets=None):
        asyncio.get_running_loop().set_exception_handler(self.throttle.loop_exception_handler)
        await super().startup(sockets)

    async def shutdown(self, sockets=None):
        timer = asyncio.get_running_loop().call_later(self.grace, self.llm.abort_all)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()
            self.config.app.state.engine_client.close()

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only; a server in a thread stops by should_exit
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def make_server(llm: LLM, config: ServerConfig, log_level: str = "info") -> Server:
    """The server over llm; with config.warm_up its warm-up starts now (warmup.py), and
    the server's `ready` event is set when it ends (at once without one)."""
    ready = threading.Event()
    app = build_app(llm, config, ready)
    backstop = config.shutdown_timeout + 10  # uvicorn cancels what is left after this
    throttle = LogThrottle(server_log)
    limits = ConnectionLimits(config.max_connections, config.header_timeout, config.body_timeout)
    server = Server(uvicorn.Config(app, host=config.host, port=config.port, log_level=log_level,
                                   timeout_graceful_shutdown=backstop, lifespan="off",
                                   http=limited_protocol(limits, throttle), ws="none"),
                    llm, config.shutdown_timeout, throttle)
    server.ready = ready
    if config.warm_up:
        start_warm_up(llm, ready, app.state.engine_client.text)
    else:
        ready.set()
    return server


def bind(config: ServerConfig) -> socket.socket:
    """The listening socket, taken before the model loads: a busy port fails at once
    (an OSError, which the CLI prints as one line)."""
    sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {config.host}:{config.port}: {e.strerror}") from None
    return sock


def log_requests() -> None:
    """The server's own lines (one per finished request, failures, throttled warnings)
    go to stderr at info level; uvicorn's access log stays behind --verbose."""
    if not server_log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        server_log.addHandler(handler)
        server_log.setLevel(logging.INFO)
        server_log.propagate = False


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach host ("localhost" or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False


def ensure_descriptors(wanted: int, log: Callable[[str], None]) -> None:
    """Raise the soft limit on open files toward wanted (up to the hard limit), so
    that max_connections is reached before accept() runs out of descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        if raised < wanted:
            log(f"warning: open files are limited to {raised}; --max-connections wants "
                f"{wanted - DESCRIPTOR_RESERVE} (raise the hard limit: ulimit -Hn)")


def serve(llm: LLM, config: ServerConfig, sock: socket.socket, log: Callable[[str], None],
          log_level: str = "info") -> None:
    """Serve on sock until SIGINT or SIGTERM; returns normally after a clean shutdown."""
    ensure_descriptors(config.max_connections + DESCRIPTOR_RESERVE, log)
    log_requests()
    if config.api_key is None and not is_loopback(config.host):
        log(f"warning: listening on {config.host} with no API key: anyone who can reach this "
            f"port can use the model (set TINYPAGED_API_KEY or --api-key-file)")
    server = make_server(llm, config, log_level)
    host, port = sock.getsockname()[:2]
    log(f"serving on http://{host}:{port}/v1 (API docs: http://{host}:{port}/docs); "
        f"Ctrl+C or SIGTERM stops it")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        llm.close()
    log("server stopped")

"""Connections: how many the server holds, and how long a client may take to send a
request, enforced in uvicorn's h11 protocol (uvicorn itself limits neither).

- At most max_connections at once. A connection beyond that takes the place of the
  connection idle longest: one with no request in progress (waiting for its first
  byte, part-way through its headers, or kept alive between requests), which is
  closed. Only when every connection is busy with a request does the new one get a
  503 and get closed. A flood of idle sockets therefore cycles through the idle
  places and never locks out a client that sends its request.
- A request's headers must be whole within header_timeout seconds (from the
  connection, or from its first byte after a kept-alive pause), and its body within
  body_timeout seconds of its headers. Past that the connection is closed, with a
  408 when no request was read yet: a client stalled mid-request holds nothing, and
  a shutdown does not wait for it.
- The warnings this produces go through one LogThrottle, as do asyncio's own (its
  "accept() out of system resource" repeats many times a second when descriptors
  run out).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import error_body

LOG_INTERVAL = 10.0  # seconds between two log lines of one kind


class LogThrottle:
    """At most one line of each kind per interval; the next line says how many were
    left out meanwhile."""

    def __init__(self, logger: logging.Logger, interval: float = LOG_INTERVAL):
        self.logger, self.interval = logger, interval
        self._last: dict[str, float] = {}
        self._left_out: dict[str, int] = {}

    def warning(self, kind: str, message: str) -> bool:
        """Log message unless a line of this kind went out less than interval ago."""
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            self._left_out[kind] = self._left_out.get(kind, 0) + 1
            return False
        left_out = self._left_out.pop(kind, 0)
        self._last[kind] = now
        suffix = f" ({left_out} more like it in the last {now - last:.0f} s)" if left_out else ""
        self.logger.warning("%s%s", message, suffix)
        return True

    def loop_exception_handler(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """For loop.set_exception_handler: asyncio's reports, each kind throttled."""
        kind = "asyncio: " + str(context.get("message", "error"))
        if self.warning(kind, kind):
            loop.default_exception_handler(context)


@dataclass(slots=True, frozen=True)
class ConnectionLimits:
    max_connections: int
    header_timeout: float  # seconds
    body_timeout: float  # seconds


def raw_response(status: int, reason: str, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response in OpenAI's error shape, closing the connection (for
    a connection that has no request object to answer through)."""
    body = json.dumps(error_body(status, message, code=code)).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n")
    if status == 503:
        head += "retry-after: 1\r\n"
    return head.encode() + b"\r\n" + body


def limited_protocol(limits: ConnectionLimits, throttle: LogThrottle) -> type:
    """The h11 protocol class for one server: its limits, and the registry of its idle
    connections that the class shares."""
    return type("LimitedH11Protocol", (LimitedH11Protocol,),
                {"limits": limits, "throttle": throttle, "idle": OrderedDict()})


class LimitedH11Protocol(H11Protocol):
    limits: ConnectionLimits
    throttle: LogThrottle
    idle: OrderedDict  # this server's idle connections, idle longest first

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: str | None = None  # what the deadline waits for: "headers" or "body"
        self._refused = False
        if len(self.connections) >= self.limits.max_connections and not self._evict_idlest():
            self._refused, self.transport = True, transport
            transport.write(raw_response(503, "Service Unavailable",
                                         f"the server holds {len(self.connections)} connections, "
                                         f"each with a request in progress; retry later",
                                         "server_overloaded"))
            transport.close()
            self.throttle.warning("refused", f"refused a connection: {len(self.connections)} "
                                             f"connections are busy (--max-connections)")
            return
        super().connection_made(transport)
        self._follow()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self.idle.pop(self, None)
        self._disarm()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """A connection still reading its request has no answer coming: close it now
        rather than let the shutdown wait for it."""
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self._responding():
            self.transport.close()
            return
        super().shutdown()

    # -- where the connection stands -------------------------------------------------
    def _responding(self) -> bool:
        return self.cycle is not None and self.cycle.response_started \
            and not self.cycle.response_complete

    def _follow(self) -> None:
        """After anything that moves the h11 state: idle or not, and which deadline."""
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        idle = state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)
        if idle and self not in self.idle:
            self.idle[self] = None
        elif not idle:
            self.idle.pop(self, None)
        if state is h11.IDLE and (self.cycle is None or self.cycle.response_complete):
            # a new request: waiting for its first byte (uvicorn's keep-alive timer covers
            # a kept-alive pause) or reading its headers
            started = self.timeout_keep_alive_task is None
            self._arm("headers" if started else None)
        elif state is h11.SEND_BODY:
            self._arm("body")
        else:
            self._arm(None)

    def _arm(self, phase: str | None) -> None:
        """Run the deadline of phase ("headers" or "body"), kept if already running."""
        if phase is not None and self._deadline is not None and self._phase == phase:
            return
        self._disarm()
        if phase is not None:
            seconds = self.limits.header_timeout if phase == "headers" else self.limits.body_timeout
            self._phase = phase
            self._deadline = self.loop.call_later(seconds, self._expire, phase)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self, phase: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        client = "%s:%s" % self.client if self.client else "a client"
        if phase == "headers":
            seconds = self.limits.header_timeout
            self.transport.write(raw_response(408, "Request Timeout",
                                              f"the request was not received within {seconds:g} s",
                                              "request_timeout"))
        else:
            seconds = self.limits.body_timeout
        self.transport.close()
        self.throttle.warning(phase, f"closed the connection of {client}: its request {phase} "
                                     f"took longer than {seconds:g} s")

    def _evict_idlest(self) -> bool:
        """Close the connection idle longest to make room; False if none is idle."""
        while self.idle:
            victim, _ = self.idle.popitem(last=False)
            if not victim.transport.is_closing():
                victim._disarm()
                victim.transport.close()
                self.throttle.warning("evicted", f"over {self.limits.max_connections} "
                                                 f"connections: closed the one idle longest")
                return True
        return False

"""uvicorn's httptools protocol with the limits it lacks: header and body timeouts, header size and count.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but has no timeout for a
connection that never finishes its headers or body, and httptools buffers an unfinished header of
any size, so slow connections hold file descriptors for ever and unfinished headers hold memory
(`cachegate chaos slow`, docs/reliability.md). This protocol adds (``server:`` in the config, ``ServerConfig``):

- ``header_timeout_s``: from connecting (or a request's first byte on a kept-alive connection) to
  its complete headers; past it, 408 in the OpenAI envelope and the connection closes;
- ``body_timeout_s`` (whole body) and ``body_idle_timeout_s`` (between pieces): past either the
  connection closes, which the request sees as its client leaving (so it gives back what it held);
- ``max_header_bytes`` (request line + headers, counted as they arrive, so an unfinished header
  costs at most this much memory) and ``max_headers``: past either, 431 and close.

It tells the request being served when its client leaves (``watch_lost``: the connection closed
before the response was complete), so the request path needs no task per request waiting on
``receive()``. It also lends the client's connection to the SSE relay (``DIRECT`` in the request scope's
``extensions``, ``direct_transport``): once a streamed response's headers went out through ASGI,
the relay writes its chunk frames to the transport itself, with the connection's write flow control
reported to it (``on_writable``), instead of one ASGI ``send`` per chunk (gateway/relay/events.py); and the
request path writes a whole (non-streamed) response head and body at once (``respond``: the one way a
whole response bypasses uvicorn's two ``send`` calls; every other response goes through them).

It relies on members of uvicorn's ``HttpToolsProtocol`` and ``RequestResponseCycle`` that are not
public API: ``pyproject.toml`` pins uvicorn to the versions checked to have them, and
``tests/gateway/test_uvicorn_members.py`` fails, naming the member, on a version that moved one.

Every refusal here is a complete JSON error (never the text/plain 400 of uvicorn). The settings
reach every worker process through ``CACHEGATE_SERVER_LIMITS`` (JSON), set by ``gateway/serve.py``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass

import httptools
import orjson
from uvicorn.logging import TRACE_LOG_LEVEL
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE, HttpToolsProtocol
from uvicorn.protocols.utils import get_local_addr, get_remote_addr, is_ssl

from gateway.http.errors import error_body

ENV = "CACHEGATE_SERVER_LIMITS"
DIRECT = "cachegate.transport"

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


@dataclass(frozen=True, slots=True)
class Limits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    body_idle_timeout_s: float = 15.0
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100


_limits: Limits | None = None


def limits() -> Limits:
    global _limits
    if _limits is None:
        raw = os.environ.get(ENV)
        fields = set(Limits.__dataclass_fields__)
        _limits = Limits(**{k: v for k, v in orjson.loads(raw).items() if k in fields}) if raw else Limits()
    return _limits


def refusal(status: int, message: str, code: str) -> bytes:
    body = error_body(status, message, code)
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        % (status, _REASONS[status], len(body))
    ) + body


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` plus header/body timeouts and header limits, and the client's connection
    lent to the relay (module docstring)."""

    on_writable: Callable[[bool], None] | None = None
    """Told when the client's transport passes its high-water mark (False) and drains (True)."""

    _on_lost: Callable[[], None] | None = None
    _lost = False

    def watch_lost(self, callback: Callable[[], None]) -> bool:
        """Call ``callback`` once when the connection closes (the request path's "client left", with
        no task per request waiting on ``receive()``); False if it has closed already."""
        if self._lost:
            return False
        self._on_lost = callback
        self.flow.resume_reading()  # as a waiting receive() would: a paused read never sees EOF
        return True

    def unwatch_lost(self, callback: Callable[[], None]) -> None:
        if self._on_lost is callback:
            self._on_lost = None

    def direct_transport(self) -> asyncio.Transport | None:
        """The client's transport while the current response is started, chunked and open (the relay
        may then write chunk frames to it), else None."""
        cycle = self.cycle
        if (
            cycle is None
            or not cycle.response_started
            or cycle.response_complete
            or cycle.disconnected
            or not cycle.chunked_encoding
            or self.transport.is_closing()
        ):
            return None
        return self.transport

    def respond(self, scope: object, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """Write the whole response of the request of ``scope`` (head, ``content-length`` and body) in
        one write, as uvicorn's ``send`` would in two calls, and complete its cycle; False (nothing
        done: use ``send``) unless that response is not started and the connection can take it now."""
        cycle = self.cycle
        if (
            cycle is None
            or cycle.scope is not scope  # a pipelined request's cycle, not this one's
            or cycle.response_started
            or cycle.disconnected
            or cycle.access_log
            or self.flow.write_paused
            or cycle.scope["method"] == "HEAD"
        ):
            return False
        parts = [STATUS_LINE[status]]
        for name, value in (*cycle.default_headers, *headers):
            if HEADER_RE.search(name) or HEADER_VALUE_RE.search(value):
                return False  # uvicorn's send raises on it: let it
            parts += (name.lower(), b": ", value, b"\r\n")
        parts.append(b"content-length: %d\r\n" % len(body))
        if not cycle.keep_alive:
            parts.append(b"connection: close\r\n")
        parts += (b"\r\n", body)
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        self.transport.write(b"".join(parts))
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            self.transport.close()
        cycle.on_response()
        return True

    def writing_paused(self) -> bool:
        return self.flow.write_paused

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.on_writable is not None:
            self.on_writable(False)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.on_writable is not None:
            self.on_writable(True)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # uvicorn's own, but the addresses from the transport's extra info, which uvloop filled at
        # accept: uvicorn asks socket objects made for the purpose (five syscalls a connection).
        self.connections.add(self)
        self.transport = transport
        self.flow = FlowControl(transport)
        local, peer = transport.get_extra_info("sockname"), transport.get_extra_info("peername")
        if isinstance(local, tuple) and isinstance(peer, tuple):
            self.server, self.client = (str(local[0]), int(local[1])), (str(peer[0]), int(peer[1]))
        else:  # not uvloop's TCP, or a Unix socket: uvicorn's way
            self.server, self.client = get_local_addr(transport), get_remote_addr(transport)
        self.scheme = "https" if is_ssl(transport) else "http"
        if self.logger.level <= TRACE_LOG_LEVEL:
            prefix = f"{self.client[0]}:{self.client[1]} - " if self.client else ""
            self.logger.log(TRACE_LOG_LEVEL, "%sHTTP connection made", prefix)
        self._lim = limits()
        self._reading_head = True
        self._head_bytes = 0
        self._header_count = 0
        self._refusal: tuple[int, str, str] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._due: float | None = None
        self._on_due: Callable[[], None] = self._head_timeout
        self._body_deadline = 0.0
        self._arm(self._lim.header_timeout_s, self._head_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)
        self.on_writable = None
        self._lost = True
        lost, self._on_lost = self._on_lost, None
        if lost is not None:
            lost()

    # One lazily re-armed timer per connection: a phase (headers, body) only moves its deadline;
    # the timer is replaced only when the deadline comes earlier than it, and when it fires early
    # it re-arms for what is left. Three timers made and cancelled per request cost measurably more.
    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        due = self.loop.time() + delay
        self._due, self._on_due = due, callback
        if self._timer is None or self._timer_at > due:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._timer_at = self.loop.call_at(due, self._fire), due

    def _disarm(self) -> None:
        self._due = None  # a timer still armed fires into nothing

    def _fire(self) -> None:
        self._timer = None
        due = self._due
        if due is None:
            return
        if due - self.loop.time() > 0.001:
            self._timer, self._timer_at = self.loop.call_at(due, self._fire), due
            return
        self._due = None
        self._on_due()

    def _refuse(self, status: int, message: str, code: str) -> None:
        self._disarm()
        if not self.transport.is_closing():
            if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
                self.transport.write(refusal(status, message, code))
            self.transport.close()

    def _head_timeout(self) -> None:
        if self.cycle is not None and not self.cycle.response_complete and not self._reading_head:
            return  # a request is being served: its own timeouts apply
        self._refuse(
            408, f"The request headers did not arrive within {self._lim.header_timeout_s:g} s.", "request_timeout"
        )

    def _body_timeout(self) -> None:
        if self.flow.read_paused:  # the app has not taken what arrived yet: not the client's fault
            self._arm(self._lim.body_idle_timeout_s, self._body_timeout)
            return
        if not self.transport.is_closing():
            self.transport.close()  # the request sees its client leave and gives back what it held

    def _arm_body(self) -> None:
        remaining = self._body_deadline - self.loop.time()
        self._arm(max(0.0, min(self._lim.body_idle_timeout_s, remaining)), self._body_timeout)

    def data_received(self, data: bytes) -> None:
        if self._reading_head:
            self._head_bytes += len(data)
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            self._refuse(*(self._refusal or (400, "Invalid HTTP request.", "invalid_http")))
            return
        if self._reading_head and self._head_bytes > self._lim.max_header_bytes:
            self._refuse(
                431, f"The request line and headers pass {self._lim.max_header_bytes} bytes.", "headers_too_large"
            )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {DIRECT: self}  # type: ignore[dict-item]
        self._reading_head = True
        self._header_count = 0
        if self._due is None or self._on_due == self._idle_timeout:
            # a request on a kept-alive connection: its headers get the same time
            self._arm(self._lim.header_timeout_s, self._head_timeout)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self._lim.max_headers:
            self._refusal = (431, f"More than {self._lim.max_headers} header fields.", "too_many_headers")
            raise ValueError("too many headers")  # stops the parser; data_received answers 431
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._head_bytes = 0
        self._body_deadline = self.loop.time() + self._lim.body_timeout_s
        self._arm_body()
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._arm_body()

    def on_message_complete(self) -> None:
        self._disarm()
        self._reading_head = True  # what arrives next is the next request's head
        self._head_bytes = 0
        super().on_message_complete()

    def on_response_complete(self) -> None:
        # uvicorn's, but the keep-alive timeout on the connection's one lazy timer (``_arm``):
        # uvicorn makes a timer per response and cancels it at the next request's first byte.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._arm(self.timeout_keep_alive, self._idle_timeout)

    def _idle_timeout(self) -> None:
        if self.cycle is None or self.cycle.response_complete:
            self.timeout_keep_alive_handler()

"""A streamed request that waits long in the queue: its response opened early.

Until it is dispatched, a request gets no response bytes. A *streamed* one still waiting after
``Config.queue_open_after_s`` gets its 200 SSE headers, then the surface's keep-alive
(``Surface.waiting``: an SSE comment, or a ``ping`` event on /v1/messages) at the SSE keep-alive
cadence, so client and ingress idle timeouts do not fire while it waits. From then on every later
``http.response.start`` is swallowed (the status already went out): a 200 stream continues on the
same response, and any other answer (a refusal, an upstream error) becomes one in-stream error
event in the surface's own shape (``Surface.stream_error``), then the end of the stream.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.types import Message, Send

from gateway.relay.proxy import SSE_HEADERS
from gateway.surfaces.base import Surface


class HeldOpen:
    """Wraps ``send`` for one streamed request while it waits (see the module docstring)."""

    def __init__(self, send: Send, surface: Surface, rid: str, after_s: float, every_s: float) -> None:
        self._send = send
        self.inner = send
        """The wrapped ``send`` (the path uses it directly when the response was never opened early)."""
        self.surface = surface
        self.rid = rid
        self.after_s = after_s
        self.every_s = max(0.05, every_s or after_s)
        self.opened = False
        self._status = 200
        self._error = b""
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        # A timer, and a task only if it fires: most requests are dispatched long before, and a
        # task made and cancelled per streamed request was a measurable part of a short one.
        if self.after_s > 0:
            self._timer = asyncio.get_running_loop().call_later(self.after_s, self._open)

    def _open(self) -> None:
        self._timer = None
        self._task = asyncio.create_task(self._run(), name=f"held-{self.rid}")

    async def stop(self) -> None:
        """The wait is over: no more keep-alives (the answer follows through ``send``)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        self.opened = True
        await self._send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [*SSE_HEADERS, (b"x-request-id", self.rid.encode())],
            }
        )
        while True:
            await self._send({"type": "http.response.body", "body": self.surface.waiting(), "more_body": True})
            await asyncio.sleep(self.every_s)

    async def send(self, message: Message) -> None:
        if not self.opened:
            await self._send(message)
            return
        if message["type"] == "http.response.start":
            self._status = int(message.get("status", 200))
            return
        if message["type"] != "http.response.body" or self._status == 200:
            await self._send(message)
            return
        self._error += message.get("body", b"")
        if not message.get("more_body", False):
            body = self.surface.stream_error(self._status, self._error)
            await self._send({"type": "http.response.body", "body": body, "more_body": False})

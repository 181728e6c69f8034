"""The relay of a translated surface: the backend answers chat completions, the client gets
Responses or Messages, built by a pure translator (``gateway/surfaces/translate/``).

The upstream chat stream goes through ``TranslatingRelay`` on the one relay loop (so keep-alives,
the broken-stream error event, first-token and usage accounting are chat's own); each complete chat
event is parsed and fed to the translator. The translator's ``start()`` goes out with the 200 headers (on
dispatch, not at the first token: clients and ingress see bytes at once); a ``: keepalive``
comment becomes the surface's own keep-alive (``ping`` on Messages); at the upstream's end the
stream is finished when the upstream said so (a ``finish_reason``, or ``[DONE]``), else failed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson
from starlette.types import Send

from gateway.http.wire import WireResponse
from gateway.surfaces.base import RelayContext, TranslatingRelay


class StreamTranslator(Protocol):
    """What ``ResponsesStream`` and ``MessagesStream`` both offer."""

    @property
    def saw_finish(self) -> bool: ...

    def start(self) -> bytes: ...

    def feed(self, payload: Any) -> bytes: ...

    def finish(self) -> bytes: ...


class TranslatedRelay(TranslatingRelay):
    """One translated answer (a new relay per attempt: it holds the stream's state).

    ``stream_translator`` is None for a non-streamed request; ``whole_answer(status, payload)``
    translates a complete answer (a chat completion, or an upstream error to re-shape);
    ``keepalive`` is what a ``: keepalive`` comment becomes; ``fail(message)`` ends a broken stream;
    ``done(ok)`` (async) runs once the answer is over (e.g. store the final Response); ``on_start``
    (async) before a stream is relayed; ``on_cancel()`` gives the last bytes of a stream cancelled
    through the API (``cancel_requested`` set, then ``task`` cancelled)."""

    def __init__(
        self,
        stream_translator: StreamTranslator | None,
        whole_answer: Callable[[int, bytes], tuple[int, bytes]],
        keepalive: bytes,
        fail: Callable[[str], bytes],
        done: Callable[[bool], Awaitable[None]] | None = None,
        on_cancel: Callable[[], bytes] | None = None,
        on_start: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.translator = stream_translator
        self.whole_answer = whole_answer
        self.keepalive = keepalive
        self.fail = fail
        self.done = done
        self.on_cancel = on_cancel
        self.on_start = on_start
        self.saw_done = False
        self.cancel_requested = False
        self.task: asyncio.Task[Any] | None = None

    def translate_event(self, event: bytes) -> bytes:
        assert self.translator is not None
        if event.startswith(b":"):
            return self.keepalive
        data = b"".join(line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:"))
        if not data:
            return b""
        if data.strip() == b"[DONE]":
            self.saw_done = True
            return b""
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            return b""
        return self.translator.feed(payload)

    def start_stream(self) -> bytes:
        assert self.translator is not None
        return self.translator.start()

    def finish_stream(self) -> bytes:
        assert self.translator is not None
        if self.translator.saw_finish or self.saw_done:
            return self.translator.finish()
        return self.fail("The upstream stream ended before the answer was complete.")

    def translate_whole(self, status: int, payload: bytes, content_type: bytes) -> tuple[int, bytes, bytes]:
        status, body = self.whole_answer(status, payload)
        return status, body, b"application/json"

    async def stream(self, response: WireResponse, send: Send, ctx: RelayContext) -> None:
        assert self.translator is not None
        ok = False
        self.task = asyncio.current_task()
        if self.on_start is not None:
            await self.on_start()
        try:
            await super().stream(response, send, ctx)
            ok = ctx.result.stream_error is None and (self.translator.saw_finish or self.saw_done)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self.cancel_requested or task is None or self.on_cancel is None:
                raise
            task.uncancel()  # cancelled through the API (POST .../cancel), not by the client leaving
            await send({"type": "http.response.body", "body": self.on_cancel(), "more_body": False})
        finally:
            if self.done is not None:
                await asyncio.shield(self.done(ok))

    async def whole(self, status: int, payload: bytes, content_type: bytes, send: Send, ctx: RelayContext) -> None:
        await super().whole(status, payload, content_type, send, ctx)
        if self.done is not None:
            await self.done(status == 200)

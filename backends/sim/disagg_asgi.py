"""ASGI plumbing of the disaggregated twin (backends/sim/disagg.py): a watched ``receive``, replays,
the decode answer's ``cached_tokens`` rewrite."""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any

import orjson
from starlette.types import Message, Receive, Send

CACHED = re.compile(rb'"(?:cached_tokens|cache_read_input_tokens)"\s*:\s*(\d+)')


class Watch:
    """A request's ``receive``, watched for the client leaving while the middleware waits."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.gone = False
        self._task: asyncio.Task[Message] | None = None

    async def receive(self) -> Message:
        if self._task is not None:
            message = await self._task
            self._task = None
        else:
            message = await self._receive()
        if message["type"] == "http.disconnect":
            self.gone = True
        return message

    async def until(self, work: Any, timeout_s: float) -> str:
        """Run ``work``: ``ok``, ``timeout``, or ``left`` (the client disconnected first)."""
        job = asyncio.ensure_future(work)
        if self._task is None:
            self._task = asyncio.ensure_future(self._receive())
        try:
            done, _ = await asyncio.wait((job, self._task), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not job.done():
                job.cancel()
                with contextlib.suppress(BaseException):
                    await job
        if job in done:
            job.result()
            return "ok"
        if self._task in done and self._task.result()["type"] == "http.disconnect":
            self.gone = True
            return "left"
        return "timeout"


def cached_from(send: Send, cached: int) -> Send:
    """The decode answer's ``cached_tokens`` set to the prefill's (SGLang hands it over with the KV);
    a whole answer's ``content-length`` follows its new length."""
    start: list[Message] = []
    parts: list[bytes] = []

    def sub(body: bytes) -> bytes:
        return CACHED.sub(lambda m: m.group(0)[: m.start(1) - m.start(0)] + str(cached).encode(), body)

    async def rewritten(message: Message) -> None:
        if message["type"] == "http.response.start":
            if any(k.lower() == b"content-length" for k, _ in message.get("headers", [])):
                start.append(message)  # a whole answer: sent with its body
                return
            await send(message)
            return
        if message["type"] != "http.response.body":
            await send(message)
            return
        if not start:
            await send({**message, "body": sub(message.get("body", b""))})
            return
        parts.append(message.get("body", b""))
        if message.get("more_body"):
            return
        body = sub(b"".join(parts))
        headers = [(k, v) for k, v in start[0].get("headers", []) if k.lower() != b"content-length"]
        await send({**start[0], "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return rewritten


async def read_body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


def replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def replay_messages(messages: list[Message], send: Send) -> None:
    for message in messages:
        await send(message)


async def send_json(send: Send, status: int, obj: Any) -> None:
    body = orjson.dumps(obj)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})

"""Drive the twin's Starlette app in-process: started and stopped through its lifespan, called over
``httpx.ASGITransport`` (no socket, no thread). For the twin over real HTTP use
``backends.sim.testing.run_twin``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import httpx
from asgi_lifespan import LifespanManager
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.types import Message

from backends.sim.runtime import Twin
from backends.sim.server import create_app

MODEL = "moonshotai/Kimi-K2-Instruct"
USER = [{"role": "user", "content": "Refactor the parser please. " * 8}]


@asynccontextmanager
async def twin_app(profile: Any = "tiny", **kwargs: Any) -> AsyncIterator[tuple[Starlette, Twin, httpx.AsyncClient]]:
    """A twin app (``create_app(profile, **kwargs)``, fast by default), its :class:`Twin`, and a client."""
    kwargs.setdefault("time_scale", 0.02)
    kwargs.setdefault("stream_interval_s", 0.005)
    kwargs.setdefault("abort_delay_s", 0.05)
    app = create_app(profile, **kwargs)
    async with LifespanManager(app, startup_timeout=10):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://twin", timeout=20) as client:
            yield app, app.state.twin, client


def sse_data(text: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def sse_events(text: str) -> list[tuple[str, str]]:
    """``(event, data)`` pairs of an SSE body whose events are named (Responses, Messages)."""
    out: list[tuple[str, str]] = []
    kind = ""
    for line in text.splitlines():
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            out.append((kind, line[6:]))
    return out


def asgi_request(
    body: bytes = b"",
    *,
    headers: dict[str, str] | None = None,
    path: str = "/v1/chat/completions",
    twin: Twin | None = None,
    disconnected: bool = False,
) -> Request:
    """A Starlette request as a route sees it: ``body`` first, then a client that leaves
    (``disconnected``) or stays; ``twin`` is what ``request.app.state.twin`` gives."""
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        if disconnected:
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # a client that stays
        raise AssertionError("unreachable")

    scope = {
        "type": "http",
        "method": "POST",
        "scheme": "http",
        "server": ("twin", 80),
        "path": path,
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "app": SimpleNamespace(state=SimpleNamespace(twin=twin)),
    }
    return Request(scope, receive)

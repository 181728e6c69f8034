"""Drive the gateway's ASGI app in-process: a gateway built from a config dict, started and stopped
through its lifespan, and a raw ASGI call whose client can leave after N body chunks (which
``httpx.ASGITransport`` cannot do: it waits for the whole response)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
from asgi_lifespan import LifespanManager
from starlette.applications import Starlette
from starlette.types import Message

from gateway.app import create_app
from gateway.config.schema import Config
from gateway.worker import Gateway
from tests.fake_upstream import SERVED


def config(*urls: str, policy: str = "gateway", **extra: Any) -> Config:
    """A gateway over ``urls`` for model alias ``kimi``; health checks slow enough not to interfere."""
    return Config.model_validate(
        {
            "models": {"kimi": {"upstream_model": SERVED, "backends": [{"url": u} for u in urls]}},
            "health": {"interval_s": 30.0, "load_interval_s": 30.0},
            "policy": policy,
            **extra,
        }
    )


@asynccontextmanager
async def running(cfg: Config, **kwargs: Any) -> AsyncIterator[tuple[Starlette, httpx.AsyncClient]]:
    """The app started through its lifespan, and an httpx client that calls it in-process."""
    app = create_app(cfg, **kwargs)
    async with LifespanManager(app, startup_timeout=20):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            yield app, client


async def call_and_leave(
    app: Starlette, path: str, body: dict[str, Any], leave_after_chunks: int, headers: dict[str, str] | None = None
) -> tuple[int, list[bytes]]:
    """POST ``body``; the client disconnects once it has ``leave_after_chunks`` body chunks.
    Returns the status and the chunks it got."""
    raw = orjson.dumps(body)
    left = asyncio.Event()
    delivered = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body" and message.get("body"):
            chunks.append(message["body"])
            if len(chunks) >= leave_after_chunks:
                left.set()

    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": hdrs,
        "client": ("127.0.0.1", 50000),
        "server": ("gateway", 80),
        "state": {},
    }
    await asyncio.wait_for(app(scope, receive, send), 20)
    return status, chunks


def gateway_of(app: Starlette) -> Gateway:
    """The worker an app built by ``create_app`` holds."""
    gw = app.state.gateway
    assert isinstance(gw, Gateway)
    return gw

"""The prefill twin's KV rooms and its bootstrap server (``--disaggregation-bootstrap-port``).

SGLang 0.5.23's decode server registers with the prefill server's bootstrap server (HTTP on the
bootstrap port) and the prefill pushes the room's KV to it (Mooncake/NIXL); the prefill request
answers once the transfer succeeded. The twin keeps the rendezvous and drops the RDMA: the decode
twin long-polls ``GET /kv/{room}?wait=S`` on the prefill twin's bootstrap port; the answer (the
room's prompt and cached tokens) is the transfer's end, after which the decode twin waits the
transfer time (tokens × KV bytes per token over the link) itself.

A room is one request (SGLang's rule: a second receiver is refused, a closed room is a tombstone):
``ready`` once the prefill computed it, ``taken`` once a decode fetched it, ``failed`` when the
prefill leg ended without handing it over (aborted, timed out, refused). Answers: 200 the room,
410 failed, 409 already taken, 408 not ready within ``wait``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import orjson

TOMBSTONE_S = 60.0
"""How long a finished or failed room is remembered (a late decode gets 410/409, not a wait)."""


@dataclass(eq=False)
class Room:
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    taken: asyncio.Event = field(default_factory=asyncio.Event)
    failed: bool = False
    tokens: int = 0
    cached_tokens: int = 0
    ended_at: float | None = None


class Rooms:
    """The prefill twin's rooms and the bootstrap server that hands them over."""

    def __init__(self) -> None:
        self.rooms: dict[int, Room] = {}
        self.server: asyncio.Server | None = None
        self.fetches = 0
        """Fetches answered 200 (a room handed over)."""

    def room(self, room: int) -> Room:
        now = time.monotonic()
        for key in [k for k, r in self.rooms.items() if r.ended_at is not None and now - r.ended_at > TOMBSTONE_S]:
            del self.rooms[key]
        return self.rooms.setdefault(room, Room())

    def computed(self, room: int, tokens: int, cached: int) -> Room:
        r = self.room(room)
        r.tokens, r.cached_tokens = tokens, cached
        r.ready.set()
        return r

    def fail(self, room: int) -> None:
        r = self.room(room)
        if not r.taken.is_set():
            r.failed = True
        r.ended_at = time.monotonic()
        r.ready.set()

    async def fetch(self, room: int, wait_s: float) -> tuple[int, dict[str, object]]:
        r = self.room(room)
        if r.taken.is_set():
            return 409, {"error": f"room {room} was already handed over"}
        try:
            await asyncio.wait_for(r.ready.wait(), wait_s)
        except TimeoutError:
            return 408, {"error": f"room {room} not computed within {wait_s:g} s"}
        if r.failed:
            return 410, {"error": f"room {room} failed on the prefill server"}
        if r.taken.is_set():
            return 409, {"error": f"room {room} was already handed over"}
        r.taken.set()
        r.ended_at = time.monotonic()
        self.fetches += 1
        return 200, {"room": room, "tokens": r.tokens, "cached_tokens": r.cached_tokens}

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._serve, host, port)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 1.0)
            self.server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One ``GET /kv/{room}?wait=S`` per connection (HTTP/1.1, ``connection: close``)."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            path, _, query = target.partition("?")
            params = dict(p.partition("=")[::2] for p in query.split("&") if p)
            parts = path.strip("/").split("/")
            if method != "GET" or len(parts) != 2 or parts[0] != "kv" or not parts[1].isdigit():
                status, body = 404, dict[str, object]({"error": "not found"})
            else:
                status, body = await self.fetch(int(parts[1]), float(params.get("wait", "300")))
            payload = orjson.dumps(body)
            writer.write(
                b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                % (status, len(payload), payload)
            )
            await writer.drain()
        except (OSError, ValueError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            writer.close()

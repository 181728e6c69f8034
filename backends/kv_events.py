"""Subscribing to SGLang's KV events: one asyncio task per backend rank, feeding its ``EngineMirror``.

Each task holds a SUB socket on the rank's endpoint (``port + rank``) and, when configured, a DEALER on
its replay endpoint. Live messages go to the mirror as they arrive (``policies/kv_view.py``). Every
``poll_s`` without a message, and at once after a gap, the task probes the replay endpoint from the last
applied message: the answer resynchronises the mirror (or rebuilds it from 0); no answer within
``poll_s`` marks the publisher dead. The router never waits on this: it reads the mirror as it is, and a
mirror that is not synced sends it to the approximate index. Needs ``pyzmq`` (``cachegate[kv-events]``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Iterable
from typing import Any

from backends.config import KVEventsSource
from policies.kv_view import EngineMirror, Event, Message

log = logging.getLogger("cachegate.kv_events")

MISSING_ZMQ = "pyzmq is not installed: pip install 'cachegate[kv-events]'"


def zmq_available() -> bool:
    try:
        import zmq.asyncio  # noqa: F401
    except ImportError:
        return False
    return True


def offset(endpoint: str, rank: int) -> str:
    base, port = endpoint.rsplit(":", 1)
    return f"{base}:{int(port) + rank}"


def to_message(seq: int, payload: bytes) -> tuple[Message, int | None]:
    """A wire message as the mirror takes it, plus the block size its stores carry (None: no store)."""
    from backends.kv_wire import AllBlocksCleared, BlockRemoved, BlockStored, decode_batch

    batch = decode_batch(payload)
    events: list[Event] = []
    block_size = None
    for e in batch.events:
        if isinstance(e, BlockStored):
            if e.medium in (None, "GPU"):
                events.append(("stored", e.block_hashes, e.parent_block_hash))
                block_size = e.block_size
        elif isinstance(e, BlockRemoved):
            if e.medium in (None, "GPU"):
                events.append(("removed", e.block_hashes, None))
        elif isinstance(e, AllBlocksCleared):
            events.append(("cleared", (), None))
    return Message(seq, hashlib.blake2b(payload, digest_size=16).digest(), events), block_size


class RankSubscriber:
    """Follows one rank's publisher into ``mirror``; ``run`` until cancelled."""

    def __init__(self, backend: str, rank: int, source: KVEventsSource, mirror: EngineMirror) -> None:
        self.backend = backend
        self.rank = rank
        self.source = source
        self.mirror = mirror
        self.endpoint = offset(source.endpoint, rank)
        self.replay = offset(source.replay_endpoint, rank) if source.replay_endpoint else None
        self.block_size: int | None = None
        self.messages = 0
        self.probes = 0

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _apply(self, frames: list[bytes]) -> bool:
        if len(frames) != 3:
            return False
        from backends.kv_wire import seq_of

        try:
            msg, size = to_message(seq_of(frames[1]), frames[2])
        except Exception:  # a malformed payload is a lost message: resync
            log.warning("kv events from %s rank %d: undecodable message", self.backend, self.rank)
            self.mirror.on_probe_timeout(self._now())
            return True
        if size:
            self.block_size = size
        self.messages += 1
        return self.mirror.on_message(msg, self._now())

    async def run(self) -> None:
        import zmq
        import zmq.asyncio

        ctx = zmq.asyncio.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        sub.connect(self.endpoint)
        poll = self.source.poll_s
        try:
            while True:
                need = False
                if await sub.poll(poll * 1000):
                    need = self._apply(await sub.recv_multipart())
                    while not need and await sub.poll(0):  # drain what is queued
                        need = self._apply(await sub.recv_multipart())
                    if not need and self.mirror.synced:
                        continue
                await self.probe(ctx)
        finally:
            sub.close(linger=0)

    async def probe(self, ctx: Any) -> None:
        """Ask the replay endpoint for everything from the last applied message (module docstring)."""
        import zmq

        self.probes += 1
        now = self._now()
        if self.replay is None:
            if not self.mirror.synced and self.mirror.state != "dead":
                pass  # nothing to ask: wait for a cleared cache or a new seq 0
            return
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(self.replay)
        got: list[Message] = []
        try:
            start = self.mirror.probe_from()
            await dealer.send_multipart((b"", start.to_bytes(8, "big")))
            deadline = now + self.source.poll_s
            from backends.kv_wire import END_SEQ

            while True:
                left = deadline - self._now()
                if left <= 0 or not await dealer.poll(left * 1000):
                    self.mirror.on_probe_timeout(self._now())
                    return
                frames = await dealer.recv_multipart()
                if len(frames) != 4 or frames[2] == END_SEQ:
                    break
                from backends.kv_wire import seq_of

                msg, size = to_message(seq_of(frames[2]), frames[3])
                if size:
                    self.block_size = size
                got.append(msg)
            self.mirror.on_replay(got, self._now())
        finally:
            dealer.close(linger=0)


class KVEventsFollower:
    """All subscriptions of one worker: ``start`` one task per (backend, rank), ``stop`` them all."""

    def __init__(self, subscribers: Iterable[RankSubscriber]) -> None:
        self.subscribers = list(subscribers)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for s in self.subscribers:
            self._tasks.append(asyncio.create_task(self._guard(s), name=f"kv-events-{s.backend}-{s.rank}"))

    async def _guard(self, s: RankSubscriber) -> None:
        while True:
            try:
                await s.run()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one publisher take the worker down: back off, reconnect
                log.exception("kv events subscriber %s rank %d failed", s.backend, s.rank)
                s.mirror.on_probe_timeout(asyncio.get_running_loop().time())
                await asyncio.sleep(s.source.poll_s)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()

    def block_size(self, backend: str) -> int | None:
        return next((s.block_size for s in self.subscribers if s.backend == backend and s.block_size), None)

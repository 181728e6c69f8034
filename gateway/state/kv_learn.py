"""The exact cache view in the gateway: subscriptions, the precise index, and how fingerprint blocks
are matched to the engine's token blocks.

The events speak of engine block hashes (SHA-256 chains over token ids); the gateway fingerprints bytes
(``policies/prefix.py``) and has no tokenizer. ``MappingLearner`` asks the engine itself: after a
request completes on a backend that publishes events, it posts the same ``messages``/``tools`` (or
``prompt``) to that backend's ``/v1/tokenize`` (SGLang's own chat template and tokenizer) off the
request path, one at a time, computes the engine's block hashes of the answer (``page_size`` = the
``block_size`` the backend's events carry), and learns (fingerprint block → engine block) pairs by
proportional position (``policies/engine_blocks.py::align_blocks``). The pairs are content-addressed
(same prefix, same hashes on every backend), so what one backend's tokenization teaches serves all.
A fingerprint whose last block is already mapped is not asked again. A conversation new to this
replica (the block three quarters into its fingerprint unmapped) is tokenized *before* it is routed, for at most
``pre_route_s`` (0.25 s), so that replicas agree on where another replica left it. Until a block is
mapped, the precise index counts it as not held on an exact backend (docs/kv-events.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import httpx

from backends.config import BackendConfig
from backends.kv_events import MISSING_ZMQ, KVEventsFollower, RankSubscriber, zmq_available
from policies.core import DecisionCore
from policies.engine_blocks import align_blocks, token_block_hashes
from policies.kv_view import BlockMap, PreciseIndex
from policies.prefix import BLOCK_BYTES
from policies.types import Fingerprint

log = logging.getLogger("cachegate.kv_events")


class MappingLearner:
    """Learns fingerprint → engine block pairs from the backends' ``/v1/tokenize`` (module docstring)."""

    def __init__(
        self, block_map: BlockMap, follower: KVEventsFollower, backends: dict[str, BackendConfig], queue: int = 64
    ) -> None:
        self.block_map = block_map
        self.follower = follower
        self.backends = backends
        self._queue: asyncio.Queue[tuple[str, Mapping[str, Any], Fingerprint, int]] = asyncio.Queue(queue)
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None
        self.learned = 0
        self.failed = 0
        self.skipped = 0
        self.pre_route = 0
        self.pre_route_missed = 0
        self.pre_route_s = max((b.kv_events.tokenize_wait_s for b in backends.values() if b.kv_events), default=0.25)
        """The longest a new conversation waits for its tokenization before it is routed anyway."""

    def observe(self, backend: str, body: Mapping[str, Any], fp: Fingerprint, rendered_bytes: int) -> None:
        """A request completed on ``backend``: learn its blocks unless they are known (never blocks)."""
        if backend not in self.backends or not fp or self.block_map.get(fp[-1][0]) is not None:
            return
        with contextlib.suppress(asyncio.QueueFull):  # behind: this turn's mapping is learned next turn
            self._queue.put_nowait((backend, body, fp, rendered_bytes))

    async def before_route(self, body: Mapping[str, Any], fp: Fingerprint, rendered_bytes: int) -> None:
        """A conversation new to this replica (the block three quarters into its fingerprint unmapped): learn its
        blocks before it is routed, waiting at most ``pre_route_s``, so that a replica that never saw it
        still finds where another replica (or a client bypassing the gateway) left it. Once per
        conversation and replica; a later turn's new tail is learned after it completes."""
        # three quarters in: past a shared system prompt, before the few blocks a turn appends
        if not fp or self.pre_route_s <= 0 or self.block_map.get(fp[len(fp) * 3 // 4][0]) is not None:
            return
        backend = next((b for b in self.backends if self.follower.block_size(b)), None)
        if backend is None:
            return
        self.pre_route += 1
        try:
            await asyncio.wait_for(self.learn(backend, body, fp, rendered_bytes), self.pre_route_s)
        except Exception:  # slow or failed: route on what is known; observe() learns it after the turn
            self.pre_route_missed += 1

    def start(self) -> None:
        self._client = httpx.AsyncClient(timeout=10.0)
        self._task = asyncio.create_task(self._run(), name="kv-mapping-learner")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._client is not None:
            await self._client.aclose()

    async def _run(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                await self.learn(*item)
            except Exception as exc:  # a tokenize that fails teaches nothing; routing is unaffected
                self.failed += 1
                log.debug("kv mapping: tokenize failed: %r", exc)

    async def learn(self, backend: str, body: Mapping[str, Any], fp: Fingerprint, rendered_bytes: int) -> None:
        cfg = self.backends[backend]
        page = self.follower.block_size(backend)
        for _ in range(3):  # the stores of the request just completed may still be on their way
            if page is not None:
                break
            await asyncio.sleep(cfg.kv_events.poll_s if cfg.kv_events else 0.5)
            page = self.follower.block_size(backend)
        if page is None or self._client is None:
            self.skipped += 1
            return
        if "messages" in body:
            payload: dict[str, Any] = {"messages": body["messages"]}
            if body.get("tools"):
                payload["tools"] = body["tools"]
        elif isinstance(body.get("prompt"), str):
            payload = {"prompt": body["prompt"]}
        else:
            return
        key = cfg.upstream_key()
        headers = {"authorization": f"Bearer {key}"} if key else {}
        r = await self._client.post(f"{cfg.url}/v1/tokenize", json=payload, headers=headers)
        r.raise_for_status()
        tokens = r.json()["tokens"]
        hashes = token_block_hashes(tokens, page)
        self.learned += self.block_map.learn(align_blocks(fp, rendered_bytes, BLOCK_BYTES, len(tokens), page, hashes))


class KVView:
    """One worker's exact cache view: the precise index given to the router, its subscriptions, the learner."""

    def __init__(self, index: PreciseIndex, follower: KVEventsFollower, learner: MappingLearner) -> None:
        self.index = index
        self.follower = follower
        self.learner = learner

    def start(self) -> None:
        self.follower.start()
        self.learner.start()

    async def stop(self) -> None:
        await self.learner.stop()
        await self.follower.stop()

    def status(self) -> dict[str, Any]:
        """Per backend rank: its mirror's state and size, and the messages seen; the mapping's size."""
        ranks = {
            f"{s.backend}@{s.rank}": {
                "state": s.mirror.state,
                "blocks": len(s.mirror.blocks),
                "messages": s.messages,
                "transitions": s.mirror.transitions,
            }
            for s in self.follower.subscribers
        }
        learner = self.learner
        return {
            "ranks": ranks,
            "mapped_blocks": len(self.index.block_map),
            "tokenized": {
                "learned_pairs": learner.learned,
                "failed": learner.failed,
                "skipped": learner.skipped,
                "before_route": learner.pre_route,
                "before_route_missed": learner.pre_route_missed,
            },
        }


def build_kv_view(core: DecisionCore, backends: list[BackendConfig]) -> KVView | None:
    """The worker's ``KVView`` when some backend has ``kv_events`` (None otherwise, or without pyzmq: said)."""
    publishing = [b for b in backends if b.kv_events is not None]
    if not publishing:
        return None
    names = ", ".join(str(b.name) for b in publishing)
    if not zmq_available():
        log.error(
            "backends %s are configured with kv_events but %s: their prefix index stays approximate", names, MISSING_ZMQ
        )
        return None
    swapped = core.router.swap_index(lambda index: PreciseIndex(index.default_capacity, BlockMap()))
    if not isinstance(swapped, PreciseIndex):
        name = core.router.name
        log.error("kv_events on %s: the router %s keeps no prefix index; events are not followed", names, name)
        return None
    precise = swapped
    subscribers = []
    for b in publishing:
        assert b.kv_events is not None and b.name is not None
        for rank in range(b.dp_size):
            slot = (b.name, rank if b.dp_size > 1 else None)
            subscribers.append(RankSubscriber(b.name, rank, b.kv_events, precise.mirror(slot)))
    follower = KVEventsFollower(subscribers)
    learner = MappingLearner(precise.block_map, follower, {str(b.name): b for b in publishing})
    log.info("following kv events of %s", names)
    return KVView(precise, follower, learner)

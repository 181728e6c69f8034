"""Stored Responses: what ``previous_response_id``, ``GET /v1/responses/{id}`` and
``POST /v1/responses/{id}/cancel`` need.

A record keeps the whole conversation a follow-up continues from (every input item, prior turns
included, plus the output items), the Response object as the client last saw it, the model, the
owning team and the status. Reads check the team: another team's response is "not found", never
"forbidden" (its existence is not leaked). Two implementations of one async interface:

- ``MemoryResponseStore``: one process; an LRU bounded by entries and by serialised bytes, each
  record expiring ``ttl_s`` after its last write.
- ``RedisResponseStore``: replicas sharing Redis; one hash per response at
  ``cachegate:resp:{id}`` (fields ``team``, ``status``, ``record``: orjson), expiring ``ttl_s``
  after its last write; cancelling is one Lua script (team check and status change together).

Records are stored serialised, so a caller mutating what it got back changes nothing stored.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import orjson
import redis.asyncio as aioredis

CANCELLABLE = ("queued", "in_progress")


@dataclass(slots=True)
class StoredResponse:
    id: str
    team: str | None
    model: str
    status: str  # queued | in_progress | completed | incomplete | failed | cancelled
    created_at: float
    input_items: list[dict[str, Any]] = field(default_factory=list)
    response: dict[str, Any] = field(default_factory=dict)

    def conversation(self) -> list[dict[str, Any]]:
        """The items a follow-up continues from: this response's input, then its output."""
        return [*self.input_items, *(self.response.get("output") or [])]

    def dumps(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def loads(cls, raw: bytes | str) -> StoredResponse:
        return cls(**orjson.loads(raw))


class ResponseStore(Protocol):
    async def put(self, record: StoredResponse) -> None:
        """Store (or replace) a record; its expiry restarts."""

    async def get(self, response_id: str, team: str | None = None) -> StoredResponse | None:
        """The record, or None when absent, expired or owned by another team."""

    async def cancel(self, response_id: str, team: str | None = None) -> StoredResponse | None:
        """Mark a queued or in-progress response ``cancelled``; the record after the attempt (its
        status says whether it was cancellable), or None when not found for this team."""

    async def delete(self, response_id: str, team: str | None = None) -> bool:
        """Remove a record; whether one was removed."""

    async def close(self) -> None: ...


def _owned(record_team: str | None, team: str | None) -> bool:
    return (record_team or "") == (team or "")


class MemoryResponseStore:
    """An LRU of serialised records bounded by ``max_entries`` and ``max_bytes``; each expires
    ``ttl_s`` after its last write (``clock``: seconds, monotonic)."""

    def __init__(
        self,
        max_entries: int = 1024,
        max_bytes: int = 256 * 1024 * 1024,
        ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self._items: OrderedDict[str, tuple[float, bytes]] = OrderedDict()  # id -> (expires, record)
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def _drop(self, response_id: str) -> None:
        _, raw = self._items.pop(response_id)
        self.bytes -= len(raw)

    def _live(self, response_id: str) -> StoredResponse | None:
        entry = self._items.get(response_id)
        if entry is None:
            return None
        if entry[0] <= self.clock():
            self._drop(response_id)
            return None
        self._items.move_to_end(response_id)
        return StoredResponse.loads(entry[1])

    async def put(self, record: StoredResponse) -> None:
        raw = record.dumps()
        if record.id in self._items:
            self._drop(record.id)
        if len(raw) > self.max_bytes:
            return  # larger than the whole budget: keeping it would evict everything else
        self._items[record.id] = (self.clock() + self.ttl_s, raw)
        self.bytes += len(raw)
        now = self.clock()
        while self._items and (len(self._items) > self.max_entries or self.bytes > self.max_bytes):
            self._drop(next(iter(self._items)))
        for key in [k for k, (expires, _) in self._items.items() if expires <= now]:
            self._drop(key)

    async def get(self, response_id: str, team: str | None = None) -> StoredResponse | None:
        record = self._live(response_id)
        return record if record is not None and _owned(record.team, team) else None

    async def cancel(self, response_id: str, team: str | None = None) -> StoredResponse | None:
        record = await self.get(response_id, team)
        if record is None:
            return None
        if record.status in CANCELLABLE:
            record.status = "cancelled"
            record.response["status"] = "cancelled"
            expires, _ = self._items[response_id]
            raw = record.dumps()
            self.bytes += len(raw) - len(self._items[response_id][1])
            self._items[response_id] = (expires, raw)
        return record

    async def delete(self, response_id: str, team: str | None = None) -> bool:
        if await self.get(response_id, team) is None:
            return False
        self._drop(response_id)
        return True

    async def close(self) -> None:
        self._items.clear()
        self.bytes = 0


_CANCEL = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return false end
if redis.call('HGET', KEYS[1], 'team') ~= ARGV[1] then return false end
if status == 'queued' or status == 'in_progress' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled')
  return 'cancelled'
end
return status
"""


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


class RedisResponseStore:
    """Records in Redis, shared by every replica (key ``{prefix}{id}``, TTL ``ttl_s``)."""

    def __init__(
        self, client: aioredis.Redis, prefix: str = "cachegate:resp:", ttl_s: float = 86400.0, owns_client: bool = False
    ) -> None:
        self.redis = client
        self.prefix = prefix
        self.ttl_ms = max(1, round(ttl_s * 1000))
        self._owns = owns_client
        self._cancel = client.register_script(_CANCEL)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> RedisResponseStore:
        client = aioredis.from_url(url, socket_timeout=2.0, socket_connect_timeout=1.0)
        return cls(client, owns_client=True, **kwargs)

    def _key(self, response_id: str) -> str:
        return self.prefix + response_id

    async def put(self, record: StoredResponse) -> None:
        key = self._key(record.id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"team": record.team or "", "status": record.status, "record": record.dumps()})
            pipe.pexpire(key, self.ttl_ms)
            await pipe.execute()

    async def get(self, response_id: str, team: str | None = None) -> StoredResponse | None:
        team_raw, status, raw = await self.redis.hmget(self._key(response_id), ["team", "status", "record"])
        if raw is None or _text(team_raw) != (team or ""):
            return None
        record = StoredResponse.loads(raw)
        record.status = _text(status) or record.status
        if record.response:
            record.response["status"] = record.status
        return record

    async def cancel(self, response_id: str, team: str | None = None) -> StoredResponse | None:
        outcome = await self._cancel(keys=[self._key(response_id)], args=[team or ""])
        if outcome is None:
            return None
        return await self.get(response_id, team)

    async def delete(self, response_id: str, team: str | None = None) -> bool:
        if await self.get(response_id, team) is None:
            return False
        return bool(await self.redis.delete(self._key(response_id)))

    async def close(self) -> None:
        if self._owns:
            await self.redis.aclose()

"""The chaos runs' client load: closed- or open-loop requests from the teams, tallied by outcome and latency."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from loadtest.chaos.stack import TEAMS, Stack


@dataclass
class Tally:
    sent: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)


class Load:
    """Closed-loop clients per team (``workers`` each), or open-loop at ``rate`` requests/s overall."""

    def __init__(
        self, stack: Stack, workers: int = 8, disconnect_p: float = 0.0, rate: float | None = None, seed: int = 1
    ) -> None:
        self.stack = stack
        self.workers = workers
        self.disconnect_p = disconnect_p
        self.rate = rate
        self.rng = random.Random(seed)
        self.tally = Tally()
        self.disconnects = 0
        self.stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: set[asyncio.Task[None]] = set()
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(60, connect=5),
            limits=httpx.Limits(max_connections=400, max_keepalive_connections=100),
        )
        self._n = 0

    def start(self) -> None:
        if self.rate:
            self._tasks.append(asyncio.create_task(self._open_loop()))
        else:
            self._tasks += [asyncio.create_task(self._worker(team)) for team in TEAMS for _ in range(self.workers)]

    async def stop(self) -> None:
        """Stop sending; requests still open are cancelled (not counted) before the client closes."""
        self.stopping = True
        for task in [*self._tasks, *self._pending]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._pending, return_exceptions=True)
        await self.client.aclose()

    async def _worker(self, team: str) -> None:
        while not self.stopping:
            await self.one(team)

    async def _open_loop(self) -> None:
        assert self.rate
        while not self.stopping:
            team = self.rng.choice(list(TEAMS))
            task = asyncio.create_task(self.one(team))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            await asyncio.sleep(self.rng.expovariate(self.rate))

    def body(self, team: str) -> dict[str, Any]:
        self._n += 1
        conv = self.rng.randrange(40)
        text = f"conversation {conv} " + "lorem ipsum dolor sit amet " * self.rng.randrange(20, 200)
        return {
            "model": "m",
            "messages": [{"role": "user", "content": text}],
            "user": team,
            "max_tokens": self.rng.randrange(8, 48),
            "stream": self.rng.random() < 0.5,
        }

    async def one(self, team: str) -> None:
        urls = self.stack.urls
        url = urls[self._n % len(urls)]
        body = self.body(team)
        leave = self.rng.random() < self.disconnect_p
        self.tally.sent += 1
        started = time.monotonic()
        kind = "ok"
        try:
            coro = self._send(url, team, body)
            if leave:
                try:
                    await asyncio.wait_for(coro, self.rng.uniform(0.0, 0.6))
                except TimeoutError:
                    self.disconnects += 1
                    kind = "client_left"
            else:
                kind = await coro
        except httpx.HTTPError as exc:
            kind = f"transport:{type(exc).__name__}"
            await asyncio.sleep(0.2)  # a dead replica: do not spin
        except Exception as exc:  # a worker that dies would silently stop the load
            kind = f"client:{type(exc).__name__}"
        if kind == "ok":
            self.tally.latencies.append(time.monotonic() - started)
        elif kind != "client_left":
            self.tally.errors[kind] += 1

    async def _send(self, url: str, team: str, body: dict[str, Any]) -> str:
        headers = {"authorization": f"Bearer {TEAMS[team]}"}
        async with self.client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
            raw = await r.aread()
        if r.status_code == 200:
            if body["stream"] and (b'"error"' in raw and b"data: [DONE]" in raw):
                return "stream_error_event"
            return "ok"
        code = ""
        with contextlib.suppress(ValueError, AttributeError, TypeError, KeyError):
            payload = r.json()
            code = "engine" if payload.get("object") == "error" else payload["error"]["code"] or ""
        return f"{r.status_code}:{code}"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

"""The twin in disaggregated mode (``cachegate sim-backend --disaggregation-mode prefill|decode``).

SGLang 0.5.23's behaviour per role, as an ASGI middleware around the twin's app (the routes and the
engine stay the co-located twin's):

- Both roles refuse a generation request without ``bootstrap_room`` with 400 ("Invalid request:
  Disaggregated request received without bootstrap room id.", scheduler.py); the twin also checks
  the other fields' types (``bootstrap_host`` str, ``bootstrap_port`` int, ``bootstrap_room`` a
  63-bit non-negative int) and records what each request carried (``GET /_twin/disagg``).
- **prefill**: the request runs with ``max_new_tokens = 1`` (prefill.py ``_process_req``) in the
  engine model; its answer is held until the decode server took the room's KV from the bootstrap
  server (``backends/sim/disagg_rooms.py``), then sent (SGLang answers after the transfer's
  success, finish ``length``); no decode within ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` (300 s)
  answers 500 and fails the room; a client that leaves fails the room.
- **decode**: the request waits for its room's KV (long-poll on the prefill's bootstrap port, then
  the transfer time over ``link_gb_s``), then generates in the engine model. The prefill server
  unreachable ``SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE`` (2) times ``..._HEARTBEAT_INTERVAL``
  (5 s) apart, a failed room, or no KV within ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT`` (300 s):
  500. A client that leaves stops the wait. The usage's ``cached_tokens`` is the prefill's (SGLang
  copies it from the prefill's metadata).
- ``/get_server_info`` and ``/get_model_info`` report ``disaggregation_mode`` (and the server info
  the bootstrap port and transfer backend); ``pending`` counts the legs waiting in this twin.

Not modelled: the decode engine still prefills the prompt itself (its time is the engine model's,
with its own prefix cache), and there is no real KV transfer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections import deque
from typing import Any, Literal

import httpx
import orjson
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backends.sim import responses as R
from backends.sim.disagg_asgi import CACHED, Watch, cached_from, read_body, replay, replay_messages, send_json
from backends.sim.disagg_rooms import Rooms
from backends.sim.tokenizer import count_tokens

Mode = Literal["null", "prefill", "decode"]
GENERATION = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/generate"})
NO_ROOM = "Invalid request: Disaggregated request received without bootstrap room id. "
MAX_TOKENS = {
    "/v1/chat/completions": ("max_tokens", "max_completion_tokens"),
    "/v1/completions": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
    "/v1/messages": ("max_tokens",),
}
_PROMPT = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d+)')
DEFAULT_LINK_GB_S = 50.0
"""KV transfer bandwidth between a prefill and a decode node, GB/s (400 Gb/s RDMA)."""


def _env(name: str, default: float) -> float:
    with contextlib.suppress(ValueError):
        return float(os.environ.get(name, default))
    return default


def check_fields(data: dict[str, Any]) -> list[str]:
    """What is wrong with the bootstrap fields of a request (types as ``PDRoutingFields`` declares them)."""
    problems = []
    host, port, room = data.get("bootstrap_host"), data.get("bootstrap_port"), data.get("bootstrap_room")
    if not isinstance(host, str) or not host:
        problems.append(f"bootstrap_host must be a host name, got {host!r}")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        problems.append(f"bootstrap_port must be a port number, got {port!r}")
    if not isinstance(room, int) or isinstance(room, bool) or not 0 <= room < 1 << 63:
        problems.append(f"bootstrap_room must be a 63-bit non-negative integer, got {room!r}")
    for rank in ("routed_dp_rank", "disagg_prefill_dp_rank"):
        if rank in data and data[rank] is not None and not isinstance(data[rank], int):
            problems.append(f"{rank} must be an integer, got {data[rank]!r}")
    return problems


def _opening(data: dict[str, Any]) -> str:
    """The prompt's first 48 characters (tests tell conversations apart by it)."""
    messages = data.get("messages") or data.get("input") or data.get("prompt") or ""
    first = messages[0] if isinstance(messages, list) and messages else messages
    content = first.get("content", "") if isinstance(first, dict) else first
    return str(content)[:48]


class Disaggregated:
    """ASGI middleware: one twin's prefill or decode role (see the module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        mode: Mode,
        *,
        bootstrap_port: int = 8998,
        host: str = "127.0.0.1",
        kv_bytes_per_token: int = 0,
        link_gb_s: float = DEFAULT_LINK_GB_S,
        time_scale: float = 1.0,
    ) -> None:
        self.app, self.mode, self.bootstrap_port, self.host = app, mode, bootstrap_port, host
        self.kv_bytes_per_token, self.link_gb_s, self.time_scale = kv_bytes_per_token, link_gb_s, time_scale
        self.bootstrap_timeout_s = _env("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300)
        self.waiting_timeout_s = _env("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300)
        self.heartbeat_s = max(2.0, _env("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0))
        self.heartbeat_failures = max(1, int(_env("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2)))
        self.rooms = Rooms()
        self.pending = 0
        self.seen: deque[dict[str, Any]] = deque(maxlen=256)
        self.outcomes: dict[str, int] = {}

    def state(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "bootstrap_port": self.bootstrap_port if self.mode == "prefill" else None,
            "pending": self.pending,
            "handed_over": self.rooms.fetches,
            "outcomes": self.outcomes,
            "seen": list(self.seen),
        }

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._lifespan(receive), send)
            return
        path = scope.get("path", "")
        if scope["type"] != "http":
            await self.app(scope, receive, send)
        elif path == "/_twin/disagg":
            await send_json(send, 200, self.state())
        elif path in ("/get_server_info", "/server_info", "/get_model_info", "/model_info"):
            await self.app(scope, receive, self._patch_info(send))
        elif scope["method"] == "POST" and path in GENERATION:
            await self._generation(scope, receive, send, path)
        else:
            await self.app(scope, receive, send)

    def _lifespan(self, receive: Receive) -> Receive:
        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup" and self.mode == "prefill":
                await self.rooms.start(self.host, self.bootstrap_port)
            elif message["type"] == "lifespan.shutdown":
                await self.rooms.stop()
            return message

        return wrapped

    def _patch_info(self, send: Send) -> Send:
        parts: list[bytes] = []
        start: dict[str, Any] = {}

        async def patched(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            parts.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(parts)
            with contextlib.suppress(ValueError):
                data = orjson.loads(body)
                if isinstance(data, dict):
                    data["disaggregation_mode"] = self.mode
                    if "max_total_num_tokens" in data:  # the server info: its server args
                        data["disaggregation_bootstrap_port"] = self.bootstrap_port
                        data["disaggregation_transfer_backend"] = "mooncake"
                    body = orjson.dumps(data)
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        return patched

    async def _generation(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        raw = await read_body(receive)
        try:
            data = orjson.loads(raw)
        except ValueError:
            data = None
        if not isinstance(data, dict):  # the twin's own routes answer a malformed body
            await self.app(scope, replay(raw, receive), send)
            return
        problems = [] if data.get("bootstrap_room") is not None else [NO_ROOM.strip()]
        problems += [p for p in check_fields(data) if not problems]
        self.seen.append(
            {
                "path": path,
                "bootstrap_host": data.get("bootstrap_host"),
                "bootstrap_port": data.get("bootstrap_port"),
                "bootstrap_room": data.get("bootstrap_room"),
                "routed_dp_rank": data.get("routed_dp_rank"),
                "disagg_prefill_dp_rank": data.get("disagg_prefill_dp_rank"),
                "problems": problems,
                "opening": _opening(data),
            }
        )
        if problems:
            self._count("refused")
            message = NO_ROOM if data.get("bootstrap_room") is None else "; ".join(problems)
            await send_json(send, 400, R.error_body(message, "BadRequestError", 400))
            return
        self.pending += 1
        try:
            if self.mode == "prefill":
                await self._prefill(scope, receive, send, path, data)
            else:
                await self._decode(scope, receive, send, data)
        finally:
            self.pending -= 1

    async def _prefill(self, scope: Scope, receive: Receive, send: Send, path: str, data: dict[str, Any]) -> None:
        room = int(data["bootstrap_room"])
        for name in MAX_TOKENS.get(path, ()):
            data.pop(name, None)
        if path == "/generate":
            data.setdefault("sampling_params", {})["max_new_tokens"] = 1
        else:
            data[MAX_TOKENS[path][0]] = 1
        held: list[Message] = []

        async def hold(message: Message) -> None:
            held.append(message)

        left = Watch(receive)
        try:
            await self.app(scope, replay(orjson.dumps(data), left.receive), hold)
            body = b"".join(m.get("body", b"") for m in held if m["type"] == "http.response.body")
            status = next((m["status"] for m in held if m["type"] == "http.response.start"), 500)
            if status != 200 or left.gone:
                self.rooms.fail(room)
                self._count("prefill_refused" if status != 200 else "client_left")
                if not left.gone:
                    await replay_messages(held, send)
                return
            prompt = _PROMPT.search(body)
            cached = CACHED.search(body)
            tokens = int(prompt.group(1)) if prompt else count_tokens(orjson.dumps(data))
            r = self.rooms.computed(room, tokens, int(cached.group(1)) if cached else 0)
            done = await left.until(r.taken.wait(), self.bootstrap_timeout_s)
            if done == "ok":
                self._count("handed_over")
                await replay_messages(held, send)
                return
            self.rooms.fail(room)
            self._count("client_left" if done == "left" else "bootstrap_timeout")
            if done == "timeout":
                message = f"Request {room} timed out after {self.bootstrap_timeout_s:g}s in KVPoll.Bootstrapping"
                await send_json(send, 500, R.error_body(message, "InternalServerError", 500))
        except BaseException:
            self.rooms.fail(room)
            raise

    async def _decode(self, scope: Scope, receive: Receive, send: Send, data: dict[str, Any]) -> None:
        left = Watch(receive)
        room, host, port = int(data["bootstrap_room"]), str(data["bootstrap_host"]), int(data["bootstrap_port"])
        fetched: dict[str, Any] = {}
        error: list[str] = []

        async def fetch() -> None:
            failures = 0
            url = f"http://{host}:{port}/kv/{room}"
            async with httpx.AsyncClient(trust_env=False) as client:
                while True:
                    try:
                        reply = await client.get(url, params={"wait": self.waiting_timeout_s}, timeout=None)
                    except httpx.HTTPError as exc:
                        failures += 1
                        if failures >= self.heartbeat_failures:
                            error.append(f"prefill server {host}:{port} unreachable: {type(exc).__name__}")
                            return
                        await asyncio.sleep(self.heartbeat_s)
                        continue
                    if reply.status_code != 200:
                        error.append(f"KV transfer failed for room {room}: {reply.json().get('error')}")
                        return
                    fetched.update(reply.json())
                    seconds = fetched["tokens"] * self.kv_bytes_per_token / (self.link_gb_s * 1e9)
                    await asyncio.sleep(seconds * self.time_scale)
                    return

        done = await left.until(fetch(), self.waiting_timeout_s)
        if done == "left":
            self._count("client_left")
            return
        if done == "timeout" or error:
            self._count("kv_failed")
            message = (
                error[0] if error else f"Request {room} timed out after {self.waiting_timeout_s:g}s waiting for KV"
            )
            await send_json(send, 500, R.error_body(message, "InternalServerError", 500))
            return
        self._count("generated")
        send = cached_from(send, int(fetched.get("cached_tokens") or 0))
        await self.app(scope, replay(orjson.dumps(data), left.receive), send)


def disagg_middleware(mode: str, bootstrap_port: int, host: str, profile: Any, time_scale: float) -> Middleware:
    """The twin app's ``Disaggregated`` layer for ``mode`` (``prefill`` or ``decode``)."""
    if mode == "prefill":
        checked: Mode = "prefill"
    elif mode == "decode":
        checked = "decode"
    else:
        raise ValueError(f"--disaggregation-mode must be null, prefill or decode, got {mode!r}")
    per_token = int(getattr(profile, "kv_bytes_per_token_per_gpu", 0)) * int(getattr(profile, "tp_size", 1) or 1)
    return Middleware(
        Disaggregated,
        mode=checked,
        bootstrap_port=bootstrap_port,
        host=host,
        kv_bytes_per_token=per_token,
        time_scale=time_scale,
    )

"""gateway/request/lifecycle.py: ``request_id``, ``read_body`` and ``RequestPath`` (one request's life
as a raw ASGI app): errors in the surface's envelope, refusals, the release of what a request held
whichever way it ends, and the client leaving while it waits or mid-stream.

``RequestPath`` runs inside the in-process app (tests/gateway/asgi.py) over the scripted upstream
(tests/fake_upstream.py)."""

from __future__ import annotations

import asyncio
import os
import re

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.types import Message

from gateway.config.schema import hash_key
from gateway.http.errors import GatewayError
from gateway.request.lifecycle import RequestPath, read_body, request_id
from gateway.surfaces.base import ClientRequest, ErrorReply
from gateway.surfaces.chat import CHAT, OpenAISurface
from gateway.surfaces.messages import MessagesSurface
from tests.fake_upstream import FakeUpstream
from tests.gateway.asgi import call_and_leave, config, running
from tests.gateway.asgi import gateway_of as _gw

CHAT_PATH = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]
KEY = "sk-team"


def chat(content: str, stream: bool = False) -> dict[str, object]:
    return {"model": "kimi", "stream": stream, "messages": [{"role": "user", "content": content}]}


async def metric(client: httpx.AsyncClient, pattern: str) -> float:
    found = re.search(pattern + r" (\S+)", (await client.get("/metrics")).text)
    return float(found.group(1)) if found else 0.0


def inflight(app: Starlette) -> int:
    team = _gw(app).core.teams.get("default")
    return team.inflight if team is not None else 0


def waiting(app: Starlette) -> int:
    team = _gw(app).core.teams.get("default")
    return team.waiting if team is not None else 0


async def until(check: object, timeout_s: float = 2.0) -> None:
    """Wait (in small steps) until ``check()`` is true."""
    for _ in range(int(timeout_s / 0.01)):
        if check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


# ----- request_id ----------------------------------------------------------------------------------


def test_request_ids_are_cg_and_32_hex_digits_and_unique_across_draws() -> None:
    ids = [request_id() for _ in range(600)]  # more than two 4 KiB draws (256 ids each)
    assert len(set(ids)) == 600
    assert all(re.fullmatch(r"cg-[0-9a-f]{32}", i) for i in ids)


def test_a_forked_child_draws_its_own_request_ids() -> None:
    request_id()  # the parent holds a drawn buffer
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then gone
        try:
            os.write(write, request_id().encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert child.startswith("cg-") and child != request_id(), "the child must not replay the parent's bytes"


# ----- read_body -----------------------------------------------------------------------------------


def receiver(*messages: Message) -> tuple[list[Message], object]:
    queue = list(messages)
    taken: list[Message] = []

    async def receive() -> Message:
        message = queue.pop(0)
        taken.append(message)
        return message

    return taken, receive


async def test_read_body_joins_the_parts() -> None:
    _, receive = receiver(
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"", "more_body": True},
        {"type": "http.request", "body": b"cd", "more_body": False},
    )
    assert await read_body(receive, Headers({}), 4) == b"abcd"  # type: ignore[arg-type]


async def test_read_body_refuses_a_declared_length_past_the_cap_before_reading() -> None:
    taken, receive = receiver({"type": "http.request", "body": b"x", "more_body": False})
    with pytest.raises(GatewayError) as info:
        await read_body(receive, Headers({"content-length": "11"}), 10)  # type: ignore[arg-type]
    assert (info.value.status, info.value.code) == (413, "request_too_large") and taken == []
    assert "11 bytes (limit 10)" in info.value.message


async def test_read_body_refuses_a_body_that_grows_past_the_cap() -> None:
    _, receive = receiver(
        {"type": "http.request", "body": b"12345", "more_body": True},
        {"type": "http.request", "body": b"678901", "more_body": False},
    )
    with pytest.raises(GatewayError) as info:  # a lying (or absent) content-length does not help
        await read_body(receive, Headers({"content-length": "3"}), 10)  # type: ignore[arg-type]
    assert info.value.status == 413
    _, exact = receiver({"type": "http.request", "body": b"x" * 10, "more_body": False})
    assert await read_body(exact, Headers({}), 10) == b"x" * 10  # type: ignore[arg-type]


async def test_read_body_is_none_when_the_client_leaves() -> None:
    _, receive = receiver({"type": "http.request", "body": b"ab", "more_body": True}, {"type": "http.disconnect"})
    assert await read_body(receive, Headers({"content-length": "junk"}), 10) is None  # type: ignore[arg-type]


# ----- RequestPath: errors in the surface's envelope -----------------------------------------------


def test_overloaded_is_a_503_in_the_surfaces_envelope_with_its_code_once() -> None:
    headers, body = RequestPath(None, CHAT).overloaded("busy", 3)  # type: ignore[arg-type]
    assert orjson.loads(body)["error"]["code"] == "overloaded"
    assert (b"retry-after", b"3") in headers and (b"content-length", str(len(body)).encode()) in headers
    assert [v for k, v in headers if k == b"x-cachegate-code"] == [b"overloaded"]
    headers, body = RequestPath(None, MessagesSurface()).overloaded("busy", 1)  # type: ignore[arg-type]
    assert orjson.loads(body)["error"]["type"] == "overloaded_error"
    assert [v for k, v in headers if k == b"x-cachegate-code"] == [b"overloaded"], "once, not twice"


async def test_a_missing_key_is_a_401_with_a_request_id(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url, keys=[{"sha256": hash_key(KEY)}])) as (_, client):
        refused = await client.post(CHAT_PATH, json=chat("hi"))
        messages = await client.post("/v1/messages", json={"model": "kimi", "max_tokens": 5, "messages": HI})
        served = await client.post(CHAT_PATH, json=chat("hi"), headers={"authorization": f"Bearer {KEY}"})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "missing_api_key"
    assert refused.headers["x-request-id"].startswith("cg-")
    assert messages.status_code == 401 and messages.json()["type"] == "error", "Anthropic's envelope there"
    assert served.status_code == 200 and upstream.requests, "the request path went on with a valid key"


class Broken(OpenAISurface):
    """A chat surface whose ``prepare`` fails as told, answering errors in an envelope of its own."""

    def __init__(self, failure: Exception) -> None:
        super().__init__("chat")
        self.name, self.path, self.failure = "broken", "/v1/broken", failure

    async def prepare(self, req: ClientRequest) -> None:
        raise self.failure

    def error(self, err: GatewayError) -> ErrorReply:
        return ErrorReply(err.status, orjson.dumps({"oops": err.code}), b"application/x-oops")


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [(GatewayError(409, "no", "conflict"), 409, "conflict"), (RuntimeError("a bug"), 500, "internal_error")],
)
async def test_a_failure_before_admission_is_answered_in_the_surfaces_envelope(
    upstream: FakeUpstream, failure: Exception, status: int, code: str
) -> None:
    async with running(config(upstream.url), surfaces=[CHAT, Broken(failure)]) as (app, client):
        response = await client.post("/v1/broken", json=chat("hi"))
        core = _gw(app).core
        assert core.running == {}, "nothing was admitted"
    assert response.status_code == status and response.json() == {"oops": code}
    assert response.headers["content-type"] == "application/x-oops"


# ----- RequestPath: admission, release, the client leaving -----------------------------------------


async def test_a_served_request_is_released_and_counted(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url)) as (app, client):
        response = await client.post(CHAT_PATH, json=chat("hi", stream=True))
        core = _gw(app).core
        assert core.running == {} and inflight(app) == 0
        ok = await metric(
            client, r'cachegate_requests_total\{backend="[^"]+",model="kimi",status="200",team="default"\}'
        )
        ttft = await metric(client, r'cachegate_ttft_seconds_count\{backend="[^"]+",model="kimi",team="default"\}')
    assert response.status_code == 200 and ok == 1 and ttft == 1


async def test_a_refusal_is_a_429_with_retry_after_and_is_counted(upstream: FakeUpstream) -> None:
    teams = {"default": {"max_concurrency": 1, "max_queue": 1}}
    async with running(config(upstream.url, teams=teams)) as (app, client):
        held = [asyncio.create_task(client.post(CHAT_PATH, json=chat("stall", stream=True))) for _ in range(2)]
        try:
            await until(lambda: inflight(app) == 1 and waiting(app) == 1)  # one runs, one waits
            refused = await client.post(CHAT_PATH, json=chat("hi"))
        finally:
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
        counted = await metric(client, r'cachegate_admission_refusals_total\{reason="team_queue_full",team="default"\}')
        await until(lambda: inflight(app) == 0 and waiting(app) == 0)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "team_queue_full"
    assert int(refused.headers["retry-after"]) >= 1 and refused.headers["x-request-id"].startswith("cg-")
    assert counted == 1


async def test_a_client_that_leaves_while_waiting_gives_its_place_back(upstream: FakeUpstream) -> None:
    teams = {"default": {"max_concurrency": 1, "max_queue": 4}}
    cfg = config(upstream.url, teams=teams, queue_open_after_s=0.02, upstream={"sse_keepalive_s": 0.05})
    async with running(cfg) as (app, client):
        gw = _gw(app)
        holder = asyncio.create_task(client.post(CHAT_PATH, json=chat("stall", stream=True)))
        await until(lambda: inflight(app) == 1)
        # held open while it waits: the 200 head and a keep-alive, then the client leaves
        status, chunks = await call_and_leave(app, CHAT_PATH, chat("hi", stream=True), leave_after_chunks=1)
        assert status == 200 and chunks == [b": keepalive\n\n"]
        assert gw.dispatcher.waiting == 0 and waiting(app) == 0
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder
        await until(lambda: inflight(app) == 0)
        assert gw.core.running == {}


async def test_a_held_stream_refused_later_ends_with_an_error_event(upstream: FakeUpstream) -> None:
    teams = {"default": {"max_concurrency": 1, "max_queue": 4, "queue_timeout_s": 0.2}}
    cfg = config(upstream.url, teams=teams, queue_open_after_s=0.02, upstream={"sse_keepalive_s": 5.0})
    async with running(cfg) as (app, client):
        holder = asyncio.create_task(client.post(CHAT_PATH, json=chat("stall", stream=True)))
        await until(lambda: inflight(app) == 1)
        waited = await client.post(CHAT_PATH, json=chat("hi", stream=True))
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder
    assert waited.status_code == 200 and waited.headers["content-type"].startswith("text/event-stream")
    keepalive, error, done = waited.content.split(b"\n\n", 2)
    assert keepalive == b": keepalive" and done == b"data: [DONE]\n\n"
    assert orjson.loads(error.removeprefix(b"data: "))["error"]["code"] == "queue_timeout"


async def test_a_client_that_leaves_mid_stream_cancels_the_upstream_and_releases(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url)) as (app, client):
        gw = _gw(app)
        opened = len(upstream.connections)
        status, chunks = await call_and_leave(app, CHAT_PATH, chat("slow", stream=True), leave_after_chunks=3)
        assert status == 200 and len(chunks) >= 3
        conn = upstream.connections[opened]
        await until(lambda: conn.closed is not None)
        assert gw.core.running == {} and inflight(app) == 0
        left = await metric(
            client, r'cachegate_requests_total\{backend="[^"]+",model="kimi",status="499",team="default"\}'
        )
    assert left == 1

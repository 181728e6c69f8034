"""The twin's disaggregated roles (backends/sim/disagg.py) against SGLang 0.5.23's PD behaviour."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Iterator

import httpx
import pytest

from backends.sim.testing import free_port, run_twin

MODEL = "moonshotai/Kimi-K2-Instruct"


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[str, str, int]]:
    bootstrap = free_port()
    with (
        run_twin("tiny", disaggregation_mode="prefill", disaggregation_bootstrap_port=bootstrap) as prefill,
        run_twin("tiny", disaggregation_mode="decode") as decode,
    ):
        yield prefill, decode, bootstrap


def _body(room: int | None, bootstrap: int, stream: bool = False, text: str = "hello there") -> dict[str, object]:
    body: dict[str, object] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 16,
        "stream": stream,
    }
    if room is not None:
        body.update(bootstrap_host="127.0.0.1", bootstrap_port=bootstrap, bootstrap_room=room)
    return body


def _state(url: str) -> dict[str, object]:
    return httpx.get(url + "/_twin/disagg").json()  # type: ignore[no-any-return]


def _until_idle(*urls: str, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while any(_state(u)["pending"] for u in urls):
        assert time.monotonic() < deadline, [_state(u)["pending"] for u in urls]
        time.sleep(0.05)


def test_each_role_reports_its_mode(pair: tuple[str, str, int]) -> None:
    prefill, decode, bootstrap = pair
    p = httpx.get(prefill + "/get_server_info").json()
    assert (p["disaggregation_mode"], p["disaggregation_bootstrap_port"]) == ("prefill", bootstrap)
    assert httpx.get(decode + "/get_server_info").json()["disaggregation_mode"] == "decode"
    assert httpx.get(decode + "/get_model_info").json()["disaggregation_mode"] == "decode"


@pytest.mark.parametrize("role", [0, 1])
def test_a_request_without_a_room_is_refused_as_sglang_does(pair: tuple[str, str, int], role: int) -> None:
    url = pair[role]
    r = httpx.post(url + "/v1/chat/completions", json=_body(None, pair[2]))
    assert r.status_code == 400
    assert r.json()["message"].startswith("Invalid request: Disaggregated request received without bootstrap room id.")


def test_bad_field_types_are_refused(pair: tuple[str, str, int]) -> None:
    _, decode, bootstrap = pair
    body = _body(1, bootstrap)
    body["bootstrap_room"] = "7"
    r = httpx.post(decode + "/v1/chat/completions", json=body)
    assert r.status_code == 400 and "bootstrap_room" in r.json()["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_both_legs_complete_and_the_decode_reports_the_prefills_cache(pair: tuple[str, str, int], stream: bool) -> None:
    prefill, decode, bootstrap = pair
    room = secrets.randbits(63)
    body = _body(room, bootstrap, stream=stream, text="a prompt long enough to matter " * 20)
    if stream:
        body["stream_options"] = {"include_usage": True}

    async def both() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as c:
            return await asyncio.gather(
                c.post(prefill + "/v1/chat/completions", json=body), c.post(decode + "/v1/chat/completions", json=body)
            )

    p, d = asyncio.run(both())
    assert p.status_code == d.status_code == 200
    if not stream:
        assert p.json()["usage"]["completion_tokens"] == 1  # SGLang's prefill runs max_new_tokens = 1
        assert p.json()["choices"][0]["finish_reason"] == "length"
        assert d.json()["usage"]["completion_tokens"] > 1
        assert (
            d.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            == (p.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        )
    else:
        assert d.text.rstrip().endswith("data: [DONE]")
    seen = [s for s in _state(decode)["seen"] if s["bootstrap_room"] == room]
    assert seen and seen[0]["problems"] == [] and seen[0]["bootstrap_host"] == "127.0.0.1"
    _until_idle(prefill, decode)


def test_a_decode_leg_whose_client_leaves_stops_waiting(pair: tuple[str, str, int]) -> None:
    _, decode, bootstrap = pair

    async def leave() -> None:
        async with httpx.AsyncClient(timeout=30) as c:
            task = asyncio.create_task(c.post(decode + "/v1/chat/completions", json=_body(12345, bootstrap)))
            await asyncio.sleep(0.5)  # the room never comes: the decode waits for it
            assert _state(decode)["pending"] == 1
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(leave())
    _until_idle(decode)
    assert _state(decode)["outcomes"].get("client_left", 0) >= 1  # type: ignore[union-attr]


@pytest.mark.slow  # one heartbeat interval (5 s)
def test_a_decode_leg_whose_prefill_is_gone_fails_after_the_heartbeats(pair: tuple[str, str, int]) -> None:
    _, decode, _ = pair
    dead = free_port()  # nobody listens: the bootstrap server is unreachable
    t0 = time.monotonic()
    r = httpx.post(decode + "/v1/chat/completions", json=_body(99, dead), timeout=30)
    assert r.status_code == 500 and "unreachable" in r.json()["message"]
    assert time.monotonic() - t0 < 10  # two failures one heartbeat (5 s) apart
    _until_idle(decode)

"""What the decision core is told about a request that ended: did the engine receive it?

The answer decides whether admission keeps the conversation's seat (its cache is in the engine) or
gives it back. It must follow what happened upstream, not the status the client was sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from policies.types import Outcome
from tests.fake_upstream import FakeUpstream
from tests.gateway.asgi import call_and_leave, config, running

CHAT = "/v1/chat/completions"


@pytest.fixture()
def upstream() -> Iterator[FakeUpstream]:
    up = FakeUpstream()
    with up.running():
        yield up


def _record_releases(gw: object) -> list[Outcome]:
    """Every outcome the request path hands the dispatcher (the real dispatcher still gets it)."""
    outcomes: list[Outcome] = []
    dispatcher = gw.dispatcher  # type: ignore[attr-defined]
    release: Callable[[str, Outcome], None] = dispatcher.release

    def recording(rid: str, outcome: Outcome) -> None:
        outcomes.append(outcome)
        release(rid, outcome)

    dispatcher.release = recording
    return outcomes


async def test_a_client_leaving_mid_stream_keeps_its_conversation_seat(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url)) as (app, _):
        gw = app.state.gateway
        outcomes = _record_releases(gw)
        body = {"model": "kimi", "stream": True, "messages": [{"role": "user", "content": "slow please"}]}
        status, chunks = await call_and_leave(app, CHAT, body, leave_after_chunks=2)
        assert status == 200 and chunks, "the stream had started when the client left"
        assert len(outcomes) == 1
        assert outcomes[0].reached_backend, "the engine had the request: its cache is there"
        assert not outcomes[0].ok
        assert len(gw.core.seats) == 1, "the conversation keeps its seat on the backend that holds its cache"


async def test_when_both_attempts_fail_to_connect_the_core_hears_nothing_reached() -> None:
    first, second = FakeUpstream(), FakeUpstream()
    with first.running(), second.running():
        async with running(config(first.url, second.url)) as (app, client):
            gw = app.state.gateway
            outcomes = _record_releases(gw)
            first.stop()
            second.stop()
            body = {"model": "kimi", "messages": [{"role": "user", "content": "hi"}]}
            response = await client.post(CHAT, json=body)
            assert response.status_code == 502
            assert response.json()["error"]["code"] == "upstream_unreachable"
            assert len(outcomes) == 1
            assert not outcomes[0].reached_backend, "no connection was made: nothing reached an engine"
            assert not gw.core.seats


async def test_a_completed_stream_reached_the_backend(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url)) as (app, client):
        outcomes = _record_releases(app.state.gateway)
        body = {"model": "kimi", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        response = await client.post(CHAT, json=body)
        assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
        assert [o.reached_backend for o in outcomes] == [True] and outcomes[0].ok

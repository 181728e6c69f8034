"""Every request is visible to the operator: one access-log line and one count per HTTP request,
unknown routes, 401s and refusals included, with a bounded route label."""

from __future__ import annotations

import re

import orjson
import pytest

from gateway.config.schema import hash_key
from tests.fake_upstream import FakeUpstream
from tests.gateway.asgi import config, running

KEY = "sk-platform"
AUTH = {"authorization": f"Bearer {KEY}"}
CHAT = "/v1/chat/completions"
HI = {"model": "kimi", "messages": [{"role": "user", "content": "hi"}]}


TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO cachegate\.access: (.*)$")


class Lines:
    """The access-log lines written to stderr so far (the text lines without their prefix)."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys
        self.raw: list[str] = []

    @property
    def lines(self) -> list[str]:
        self.raw += self.capsys.readouterr().err.splitlines()
        out = []
        for line in self.raw:
            text = TEXT_LINE.match(line)
            if text:
                out.append(text.group(1))
            elif line.startswith("{"):
                out.append(line)
        return out


@pytest.fixture()
def access(capsys: pytest.CaptureFixture[str]) -> Lines:
    capsys.readouterr()
    return Lines(capsys)


def _teams(**extra: object) -> dict[str, object]:
    return {
        "keys": [{"sha256": hash_key(KEY), "team": "platform"}],
        "teams": {
            "platform": {"max_concurrency": 4, "max_queue": 8},
            "blocked": {"max_concurrency": 0, "max_queue": 0},
        },
        **extra,
    }


async def test_every_request_gets_one_line_and_one_count(upstream: FakeUpstream, access: Lines) -> None:
    async with running(config(upstream.url, **_teams())) as (_, client):
        ok = await client.post(CHAT, json={**HI, "stream": True}, headers=AUTH)
        unknown = await client.get("/v1/nothing-here/12345")
        denied = await client.post(CHAT, json=HI, headers={"authorization": "Bearer wrong"})
        wrong_method = await client.get(CHAT)
        assert (ok.status_code, unknown.status_code, denied.status_code, wrong_method.status_code) == (
            200,
            404,
            401,
            405,
        )
        metrics = (await client.get("/metrics")).text
    assert len(access.lines) == 5, access.lines  # the four above and the /metrics scrape
    served, missing, unauthorized, not_allowed, _ = access.lines
    assert served.startswith("POST /v1/chat/completions status=200 route=/v1/chat/completions team=platform")
    assert f"backend=127.0.0.1:{upstream.port}" in served and "queue_wait_s=" in served and "ttft_s=" in served
    assert missing.startswith("GET /v1/nothing-here/12345 status=404 route=unknown")
    assert unauthorized.startswith("POST /v1/chat/completions status=401")
    assert not_allowed.startswith("GET /v1/chat/completions status=405 route=/v1/chat/completions")
    line = 'cachegate_http_requests_total{method="%s",route="%s",status="%s"} 1.0'
    assert line % ("POST", "/v1/chat/completions", "200") in metrics
    assert line % ("GET", "unknown", "404") in metrics
    assert line % ("POST", "/v1/chat/completions", "401") in metrics
    assert line % ("GET", "/v1/chat/completions", "405") in metrics


async def test_unknown_paths_share_one_bounded_label(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url)) as (_, client):
        for i in range(20):
            assert (await client.get(f"/random/{i}")).status_code == 404
        await client.request("BREW", "/coffee")
        metrics = (await client.get("/metrics")).text
    assert 'cachegate_http_requests_total{method="GET",route="unknown",status="404"} 20.0' in metrics
    assert 'method="OTHER",route="unknown"' in metrics
    assert "/random/" not in metrics and "BREW" not in metrics


async def test_refusals_are_logged_with_their_code_as_json(upstream: FakeUpstream, access: Lines) -> None:
    blocked = "sk-blocked"
    cfg = _teams(access_log="json")
    cfg["keys"] = [*cfg["keys"], {"sha256": hash_key(blocked), "team": "blocked"}]  # type: ignore[misc]
    async with running(config(upstream.url, **cfg)) as (_, client):
        refused = await client.post(CHAT, json=HI, headers={"authorization": f"Bearer {blocked}"})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "team_queue_full"
    logged = orjson.loads(access.lines[0])
    assert logged["status"] == 429 and logged["team"] == "blocked" and logged["refusal"] == "team_queue_full"
    assert logged["route"] == CHAT and logged["method"] == "POST" and "queue_wait_s" in logged
    assert "backend" not in logged, "a refused request never reached a backend"


async def test_access_log_off_still_counts(upstream: FakeUpstream, access: Lines) -> None:
    async with running(config(upstream.url, access_log="off")) as (_, client):
        assert (await client.get("/healthz")).status_code == 200
        metrics = (await client.get("/metrics")).text
    assert access.lines == []
    assert 'cachegate_http_requests_total{method="GET",route="/healthz",status="200"} 1.0' in metrics


async def test_lines_go_to_stderr_in_the_log_layout_or_as_bare_json(upstream: FakeUpstream, access: Lines) -> None:
    async with running(config(upstream.url, access_log="json")) as (_, client):
        assert (await client.get("/healthz")).status_code == 200
    async with running(config(upstream.url)) as (_, client):
        assert (await client.get("/readyz")).status_code in (200, 503)
    first, second = access.lines
    assert orjson.loads(first)["route"] == "/healthz", "json: one bare object, nothing around it"
    assert second.startswith("GET /readyz status="), "text: after the time stamp, level and logger name"
    assert len(access.raw) == 2 and access.raw[0] == first and TEXT_LINE.match(access.raw[1])


async def test_static_templates_are_remembered_and_nothing_else() -> None:
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from gateway.observability.access import AccessLog
    from gateway.observability.metrics import Metrics

    async def ok(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    routes = [Route("/a", ok, methods=["POST"]), Route("/m/{model:path}", ok)]
    seen: list[str] = []

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        seen.append(scope["cachegate.access"].route)  # type: ignore[attr-defined]

    access = AccessLog(app, routes, Metrics(), fmt="off")
    for method, path in (
        ("POST", "/a"),
        ("GET", "/a"),
        ("GET", "/m/x"),
        ("GET", "/m/y"),
        ("GET", "/zz"),
        ("POST", "/a"),
    ):
        await access({"type": "http", "method": method, "path": path, "headers": []}, None, None)  # type: ignore[arg-type]
    assert seen == ["/a", "/a", "/m/{model:path}", "/m/{model:path}", "unknown", "/a"]
    assert access._static == {"/a": "/a"}


def test_text_lines_keep_their_format() -> None:
    from gateway.observability.access import AccessRecord

    full = AccessRecord("POST", "/v1/x", "/v1/x", 429, "t", "b", "team_queue_full", 0.01234, 0.5, 1.0)
    assert full.text() == (
        "POST /v1/x status=429 route=/v1/x team=t backend=b refusal=team_queue_full"
        " queue_wait_s=0.012 ttft_s=0.500 duration_s=1.000"
    )
    bare = AccessRecord("GET", "unknown", "/nope", 404, queue_wait_s=0.0, duration_s=0.0004)
    assert bare.text() == "GET /nope status=404 route=unknown queue_wait_s=0.000 duration_s=0.000"

"""A hostile upstream against one gateway worker (issue #35): every malformation of
tests/hostile_upstream.py, streamed and not, through ``cachegate serve`` on real sockets.

For each: the client gets exactly the valid answer's bytes or a clean error in OpenAI's envelope
within the upstream idle timeout; ``/healthz`` keeps answering throughout (a frozen worker answers
nothing); the worker's memory stays flat; the next three requests get exactly their own bytes.
Then the operator's side: the malformed answers are counted, logged, and their connections closed.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.harness import Running, run_gateway
from tests.hostile_client import HealthWatch, ask, expected, gateway_config, rss_kib
from tests.hostile_upstream import CASES, HostileUpstream

pytestmark = pytest.mark.slow

IDLE_TIMEOUT_S = 1.0
MALFORMED = "upstream_malformed_response"
CLEAN_ERRORS = {
    "negative_chunk_size": MALFORMED,
    "non_hex_chunk_size": MALFORMED,
    "conflicting_content_lengths": MALFORMED,
    "transfer_encoding_and_length": MALFORMED,
    "garbage_status_line": MALFORMED,
    "megabyte_header": MALFORMED,
    "chunk_without_crlf": MALFORMED,
    "malformed_mid_stream": MALFORMED,
    "huge_chunk_size": "upstream_timeout",  # a legal size: its data never completes, so none is relayed
    "continue_kept_open": "upstream_timeout",
    "continue_then_closed": "upstream_unreachable",
    "body_cut_by_reset": None,  # upstream_error whole, upstream_stream_broken mid-stream
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[HostileUpstream]:
    with HostileUpstream().running() as up:
        yield up


@pytest.fixture(scope="module")
def gateway(upstream: HostileUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    cfg = gateway_config(tmp_path_factory.mktemp("hostile") / "c.yaml", upstream.url, IDLE_TIMEOUT_S)
    with run_gateway("--config", cfg) as base:
        yield base


def test_the_table_covers_every_case() -> None:
    assert set(CLEAN_ERRORS) == {name for name, case in CASES.items() if not case.ok}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_malformation_costs_one_request_at_most(gateway: Running, name: str, stream: bool) -> None:
    case = CASES[name]
    before = rss_kib(gateway.pid)
    with httpx.Client() as client, HealthWatch(gateway) as watch:
        got = ask(client, gateway, f"case:{name}", stream, timeout=IDLE_TIMEOUT_S + 5)
        after = [ask(client, gateway, f"{name} then {i}", stream) for i in range(3)]
    if case.ok:
        assert got.status == 200 and got.body == expected(stream, f"case:{name}"), got.describe()
    else:
        assert got.status in (200, 502, 504), got.describe()
        assert got.seconds < IDLE_TIMEOUT_S + 2, "a clean error within the upstream idle timeout"
        code = got.describe().rsplit(" ", 1)[-1]
        want = CLEAN_ERRORS[name]
        assert code == want if want else code in ("upstream_error", "upstream_stream_broken"), got.describe()
        if got.status == 200:  # the head had gone out: the stream ends with chat's error event and [DONE]
            assert stream and got.body.endswith(b"data: [DONE]\n\n")
    for i, answer in enumerate(after):
        assert answer.status == 200 and answer.body == expected(stream, f"{name} then {i}"), answer.describe()
    assert watch.polls > 0 and watch.failures == 0, "the worker kept answering /healthz"
    assert watch.slowest < 1.0, f"/healthz took {watch.slowest:.2f} s"
    assert rss_kib(gateway.pid) - before < 32 * 1024, "the worker's memory stayed flat"


def test_malformed_answers_are_counted_logged_and_never_reused(gateway: Running, upstream: HostileUpstream) -> None:
    with httpx.Client() as client:
        got = ask(client, gateway, "case:garbage_status_line", False)
        assert got.status == 502
        error = httpx.Response(502, content=got.body).json()["error"]
        assert error["code"] == MALFORMED and "malformed" in error["message"]
        metrics = client.get(gateway + "/metrics").text
    line = next(
        ln for ln in metrics.splitlines() if ln.startswith("cachegate_upstream_errors_total") and "malformed" in ln
    )
    assert float(line.rsplit(" ", 1)[1]) >= 1
    assert "sent a malformed response" in gateway.output()


def test_a_byte_on_an_idle_pooled_connection_closes_it(gateway: Running, upstream: HostileUpstream) -> None:
    """The stray answer that follows ``bytes_after_response`` lands on a connection no request owns."""
    with httpx.Client() as client:
        first = ask(client, gateway, "case:bytes_after_response", False)
        assert first.body == expected(False, "case:bytes_after_response")
        for i in range(5):
            answer = ask(client, gateway, f"pooled {i}", False)
            assert answer.body == expected(False, f"pooled {i}")


def test_the_hostile_upstream_answers_valid_requests_itself(upstream: HostileUpstream) -> None:
    """The harness's own valid answer is what ``expected`` says (so the checks above mean something)."""
    response = httpx.post(
        upstream.url + "/v1/chat/completions",
        json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200 and response.content == expected(True, "hi")

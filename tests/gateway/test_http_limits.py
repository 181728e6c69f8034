"""The served gateway over real sockets: header and body timeouts, header limits, auth edges, closed
endpoints and the metrics port, an oversized prompt refused at once (gateway CLI in front of a twin)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from backends.sim.testing import spawn_twin
from tests.fake_upstream import free_port
from tests.harness import run_gateway


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    metrics_port = free_port()
    with spawn_twin("tiny", time_scale=0.05) as twin:
        config = Path(tmp_path_factory.mktemp("cfg")) / "cachegate.yaml"
        config.write_text(
            f'models:\n  m: {{upstream_model: moonshotai/Kimi-K2-Instruct, backends: [{{url: "{twin}"}}]}}\n'
            "server: {header_timeout_s: 1.5, body_idle_timeout_s: 1.5, max_header_bytes: 8192, max_headers: 50,"
            " keep_alive_s: 2}\n"
            f"endpoints: {{require_key: true, metrics_port: {metrics_port}}}\n"
            "health: {interval_s: 0.5}\n"
        )
        with run_gateway("--config", str(config), "--api-key", "key-a=a", ready_path="/healthz") as url:
            deadline = time.monotonic() + 15  # until the twin is in rotation
            while httpx.get(url + "/readyz").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.1)
            yield url, metrics_port


def _raw(url: str, data: bytes, wait: float = 8.0) -> tuple[bytes, float]:
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(wait)
        t0 = time.monotonic()
        s.sendall(data)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks), time.monotonic() - t0


def _json_error(answer: bytes) -> dict:
    return orjson.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]


def _responses(s: socket.socket, n: int) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """Read ``n`` content-length responses off a connection: (status, headers, body) each."""
    buf, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            buf += s.recv(65536)
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(b":") for ln in lines[1:])}
        size = int(headers[b"content-length"])
        while len(buf) < size:
            buf += s.recv(65536)
        out.append((int(lines[0].split()[1]), headers, buf[:size]))
        buf = buf[size:]
    return out


def test_unfinished_headers_get_408_and_the_connection_closes(gw: tuple[str, int]) -> None:
    answer, took = _raw(gw[0], b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    assert answer.startswith(b"HTTP/1.1 408") and 1.3 < took < 5.0, (answer[:80], took)
    assert _json_error(answer)["code"] == "request_timeout"
    answer, took = _raw(gw[0], b"")  # connects and says nothing
    assert answer.startswith(b"HTTP/1.1 408") and took < 5.0


def test_keep_alive_idle_timeout_and_the_next_requests_header_timeout(gw: tuple[str, int]) -> None:
    """One timer per connection serves the keep-alive timeout too (``on_response_complete``): an idle
    kept-alive connection closes after ``keep_alive_s``, a request within it is served, and that
    request's unfinished headers still get the header timeout (not the keep-alive's)."""
    port = int(gw[0].rsplit(":", 1)[1])
    get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(8)
        s.sendall(get)
        assert _responses(s, 1)[0][0] == 200
        time.sleep(1.0)  # within keep_alive_s: the connection is still served
        s.sendall(get)
        assert _responses(s, 1)[0][0] == 200
        t0 = time.monotonic()
        assert s.recv(65536) == b"" and 1.6 < time.monotonic() - t0 < 4.0  # idle: closed after ~2 s
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(8)
        s.sendall(get)
        assert _responses(s, 1)[0][0] == 200
        s.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")  # the next request's headers never finish
        t0 = time.monotonic()
        answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408") and 1.2 < time.monotonic() - t0 < 1.9, answer[:60]


def test_header_size_and_count_limits(gw: tuple[str, int]) -> None:
    big, _ = _raw(gw[0], b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000)  # never finished
    many, _ = _raw(gw[0], b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(60)) + b"\r\n")
    assert big.startswith(b"HTTP/1.1 431") and _json_error(big)["code"] == "headers_too_large"
    assert many.startswith(b"HTTP/1.1 431") and _json_error(many)["code"] == "too_many_headers"
    garbage, _ = _raw(gw[0], b"NOT HTTP AT ALL\r\n\r\n")
    assert garbage.startswith(b"HTTP/1.1 400") and _json_error(garbage)["code"] == "invalid_http"


def test_a_stalled_body_is_cut_off(gw: tuple[str, int]) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\napi-key: key-a\r\ncontent-length: 100\r\n\r\n{"
    answer, took = _raw(gw[0], head)
    assert answer == b"" and 1.3 < took < 5.0  # closed: the request saw its client leave


def test_auth_edges(gw: tuple[str, int]) -> None:
    url = gw[0]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert httpx.post(url + "/v1/chat/completions", json=body, headers={"api-key": "key-a"}).status_code == 200
    raw = orjson.dumps(body)
    answer, _ = _raw(
        url,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \r\n"
        b"x-api-key: key-a\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(raw), raw),
    )
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]  # the empty Bearer does not hide x-api-key
    wrong = httpx.post(url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"


def test_a_whole_response_written_at_once_is_a_complete_http_response(gw: tuple[str, int]) -> None:
    """A non-streamed answer leaves in one write (``LimitedHttpToolsProtocol.respond``): it carries
    the headers uvicorn's ``send`` would give it, the connection then serves the next request (or a
    pipelined pair, the first of which goes through ``send``: the connection's cycle is the second's)
    and closes after ``keep_alive_s`` idle, and ``connection: close`` is honoured."""
    port = int(gw[0].rsplit(":", 1)[1])
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\napi-key: key-a\r\ncontent-length: %d\r\n"
    post = head % len(raw) + b"\r\n" + raw
    unknown = raw.replace(b'"m"', b'"nope"')  # refused before the path wraps send: uvicorn's send
    answers = []
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(10)
        for data, n in ((post, 1), (head % len(unknown) + b"\r\n" + unknown, 1), (post * 2, 2), (post, 1)):
            s.sendall(data)
            answers += _responses(s, n)
        t0 = time.monotonic()
        assert s.recv(65536) == b"" and 1.6 < time.monotonic() - t0 < 4.0, "keep-alive timeout after it"
    assert [status for status, _, _ in answers] == [200, 404, 200, 200, 200], answers
    ok, refused = answers[0][1], answers[1][1]
    for name in (b"date", b"server", b"content-type", b"content-length", b"x-request-id"):
        assert name in ok and name in refused, (name, ok, refused)
    assert ok[b"content-type"] == b"application/json" and ok[b"x-request-id"].startswith(b"cg-")
    assert len({h[b"x-request-id"] for _, h, _ in answers}) == 5
    for _, _, body in (answers[0], *answers[2:]):
        assert orjson.loads(body)["object"] == "chat.completion"
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(10)
        s.sendall(head % len(raw) + b"connection: close\r\n\r\n" + raw)
        [(status, headers, body)] = _responses(s, 1)
        assert status == 200 and headers[b"connection"] == b"close"
        assert s.recv(65536) == b"", "closed after the response"


def test_closed_endpoints_and_the_metrics_port(gw: tuple[str, int]) -> None:
    url, metrics_port = gw
    assert httpx.get(url + "/v1/models").status_code == 401
    assert httpx.get(url + "/v1/models", headers={"api-key": "key-a"}).json()["data"][0]["id"] == "m"
    assert httpx.get(url + "/readyz").json() == {"status": "ready"}  # status only, no names
    assert "backends" in httpx.get(url + "/readyz", headers={"api-key": "key-a"}).json()
    assert httpx.get(url + "/metrics", headers={"api-key": "key-a"}).status_code == 404  # moved
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    assert httpx.get(metrics).status_code == 401
    r = httpx.get(metrics, headers={"authorization": "Bearer key-a"})
    assert r.status_code == 200 and "cachegate_requests" in r.text
    # prometheus-client's app answers: OpenMetrics to a scraper that asks for it, and nothing but /metrics
    om = httpx.get(metrics, headers={"authorization": "Bearer key-a", "accept": "application/openmetrics-text"})
    assert om.headers["content-type"].startswith("application/openmetrics-text") and om.text.endswith("# EOF\n")
    assert httpx.get(metrics.replace("/metrics", "/v1/models"), headers={"api-key": "key-a"}).status_code == 404


def test_oversized_prompt_and_deep_json_are_400_at_once(gw: tuple[str, int]) -> None:
    url = gw[0]
    body = {"model": "m", "messages": [{"role": "user", "content": "word " * 140_000}]}
    t0 = time.monotonic()
    r = httpx.post(url + "/v1/chat/completions", json=body, headers={"api-key": "key-a"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert time.monotonic() - t0 < 2.0  # never queued (the figure is measured by `cachegate chaos hol`)
    deep = b'{"model":"m","messages":[{"role":"user","content":"x"}],"tools":' + b"[" * 500 + b"]" * 500 + b"}"
    r = httpx.post(url + "/v1/chat/completions", content=deep, headers={"api-key": "key-a"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "request_too_complex"


def test_the_scope_has_the_addresses_uvicorn_would_give() -> None:
    import threading

    import uvicorn

    from gateway.http.server import LimitedHttpToolsProtocol

    seen: list[tuple[object, object]] = []

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        if scope["type"] != "http":
            return
        seen.append((scope["client"], scope["server"]))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]

    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        http=LimitedHttpToolsProtocol,
        loop="uvloop",
        lifespan="off",
        log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            sock.settimeout(10)
            assert _responses(sock, 1)[0][2] == b"ok"
            assert seen == [(sock.getsockname(), sock.getpeername())]  # (client, server)
    finally:
        server.should_exit = True
        thread.join(10)

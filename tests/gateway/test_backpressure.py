"""A client that reads slowly makes the gateway stop reading from upstream, not buffer.

The relay writes chunk frames straight to the client's connection (gateway/relay/events.py, the callback
relay): past the client transport's high-water mark it pauses reading from upstream, and resumes
when the client drains. Here the upstream floods (events as fast as the gateway takes them), the
client stops reading: what the upstream managed to send must stop growing (kernel buffers, not the
gateway's memory, hold the difference); then the client reads and the flow resumes; then it leaves
and the upstream connection closes within a second.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import orjson

from tests.fake_upstream import FakeUpstream
from tests.gateway.test_proxy import write_config
from tests.harness import run_gateway


def _wait_for(condition: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_slow_client_pauses_upstream_reading(tmp_path: Path) -> None:
    up = FakeUpstream()
    with up.running():
        cfg = write_config(tmp_path / "c.yaml", up.url)
        with run_gateway("--config", cfg) as base:
            host, port = base.removeprefix("http://").split(":")
            body = orjson.dumps({"model": "kimi", "stream": True, "messages": [{"role": "user", "content": "flood"}]})
            client = socket.socket()
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # a small client-side buffer
            client.connect((host, int(port)))
            client.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            client.settimeout(10)
            head = b""
            while b"\r\n\r\n" not in head:
                head += client.recv(4096)
            assert head.startswith(b"HTTP/1.1 200"), head[:200]
            assert b"transfer-encoding: chunked" in head.lower()
            stream = next(c for c in up.connections if c.streaming)

            # The client reads nothing: the flood stops once the buffers on the way are full.
            assert _wait_for(lambda: up.flooded > 0, 5)
            time.sleep(1.0)
            stalled = up.flooded
            time.sleep(0.5)
            assert up.flooded - stalled < 256 * 1024, f"upstream still read: {stalled} → {up.flooded} bytes"
            assert up.flooded < 128 * 1024 * 1024, "the gateway took far more than the kernel buffers hold"

            # The client reads: the gateway reads from upstream again.
            got = 0
            while got < 4 * up.flooded + (8 << 20) and up.flooded <= stalled + (4 << 20):
                data = client.recv(1 << 20)
                assert data, "the gateway closed the stream"
                got += len(data)
            assert up.flooded > stalled + (4 << 20), "reading resumed after the client drained"
            assert b"data: {" in data

            # The client leaves: the upstream connection closes.
            client.close()
            assert _wait_for(lambda: stream.closed is not None, 1.0), "upstream closed within 1 s of the client"

"""A backend serving /v1/messages or /v1/responses itself (passthrough) that breaks off mid-stream:
the client gets the bytes so far, then one error event in its surface's shape (not chat's
``data: {"error": …}`` + ``[DONE]``), and the request counts as failed. The same for a translated
surface whose upstream chat stream breaks off (both run on the one relay loop, gateway/relay/events.py)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import orjson
import pytest

from gateway.config.schema import Config
from tests.fake_upstream import free_port
from tests.gateway.asgi import running

FIRST = {
    "messages": b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","usage":'
    b'{"input_tokens":3,"output_tokens":0}}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"Hel"}}\n\n',
    "responses": b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
    b'"delta":"Hel","sequence_number":3}\n\n',
    "completions": b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"kimi","choices":'
    b'[{"index":0,"delta":{"role":"assistant","content":"Hel"},"finish_reason":null}]}\n\n',
}


class BreakingBackend:
    """Raw HTTP: health and info answered; a POST to /v1/messages or /v1/responses gets 200 SSE
    headers, the first events, then the connection is dropped."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                path = lines[0].split(" ")[1]
                length = next(
                    (
                        int(v)
                        for k, v in (ln.split(": ", 1) for ln in lines[1:] if ": " in ln)
                        if k.lower() == "content-length"
                    ),
                    0,
                )
                await reader.readexactly(length)
                if path in ("/v1/messages", "/v1/responses", "/v1/chat/completions"):
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                    )
                    data = FIRST[path.rsplit("/", 1)[1]]
                    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.05)
                    writer.close()  # mid-stream: no last chunk
                    return
                body = {
                    "/openapi.json": {"paths": {"/v1/messages": {}, "/v1/responses": {}}},
                    "/get_server_info": {"max_total_num_tokens": 100000},
                    "/v1/models": {"data": [{"id": "kimi"}]},
                }.get(path, {})
                raw = orjson.dumps(body)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                    + str(len(raw)).encode()
                    + b"\r\n\r\n"
                    + raw
                )
                await writer.drain()

    @contextlib.contextmanager
    def running(self) -> Iterator[BreakingBackend]:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
            ready.set()
            loop.run_forever()

        thread = threading.Thread(target=main, daemon=True)
        thread.start()
        assert ready.wait(5)
        try:
            yield self
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)


@pytest.mark.parametrize("surface", ["messages", "responses"])
async def test_a_broken_native_stream_ends_with_the_surface_error_event(surface: str) -> None:
    with BreakingBackend().running() as backend:
        cfg = Config.model_validate(
            {
                "models": {"kimi": {"backends": [{"url": backend.url}], "surfaces": {surface: "passthrough"}}},
                "health": {"interval_s": 30.0, "load_interval_s": 30.0},
            }
        )
        body = (
            {"model": "kimi", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            if surface == "messages"
            else {"model": "kimi", "input": "hi", "stream": True}
        )
        async with running(cfg) as (app, client):
            response = await client.post(f"/v1/{surface}", json=body)
            exposition = app.state.gateway.metrics.exposition("")[0].decode()
    assert response.status_code == 200
    assert response.content.startswith(FIRST[surface])  # relayed byte for byte
    last = response.content[len(FIRST[surface]) :]
    assert b"[DONE]" not in last and last.startswith(b"event: error\ndata: ")
    error = orjson.loads(last.split(b"\n")[1][len(b"data: ") :])
    if surface == "messages":
        assert error["type"] == "error" and error["error"]["type"] == "api_error"
    else:
        assert error["type"] == "error" and error["code"] == "upstream_stream_broken"
    # the broken stream counts against the backend as an upstream error
    counted = f'cachegate_upstream_errors_total{{backend="127.0.0.1:{backend.port}",kind="stream_broken"}} 1.0'
    assert counted in exposition


@pytest.mark.parametrize("surface", ["messages", "responses"])
async def test_a_broken_chat_stream_ends_a_translated_stream_with_the_surface_error_event(surface: str) -> None:
    with BreakingBackend().running() as backend:
        cfg = Config.model_validate(
            {
                "models": {"kimi": {"backends": [{"url": backend.url}], "surfaces": {surface: "translate"}}},
                "health": {"interval_s": 30.0, "load_interval_s": 30.0},
            }
        )
        body = (
            {"model": "kimi", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            if surface == "messages"
            else {"model": "kimi", "input": "hi", "stream": True}
        )
        async with running(cfg) as (app, client):
            response = await client.post(f"/v1/{surface}", json=body)
            exposition = app.state.gateway.metrics.exposition("")[0].decode()
    assert response.status_code == 200
    events = [e for e in response.content.split(b"\n\n") if e]
    assert b"Hel" in response.content, "what arrived before the break was translated and sent"
    assert b"[DONE]" not in response.content and b'data: {"error"' not in response.content
    kinds = [e.split(b"\n", 1)[0] for e in events]
    if surface == "messages":
        assert kinds[-1] == b"event: error" and b"message_stop" not in response.content
    else:
        assert b"event: response.failed" in kinds and b"response.completed" not in response.content
    counted = f'cachegate_upstream_errors_total{{backend="127.0.0.1:{backend.port}",kind="stream_broken"}} 1.0'
    assert counted in exposition

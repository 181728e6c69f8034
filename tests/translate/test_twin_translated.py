"""The translators fed by a real engine twin over loopback HTTP: what the twin streams and answers
(SGLang's chunk shapes, Kimi's tool-call ids) becomes events and objects the SDKs' types accept."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pydantic
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent

from backends.sim.testing import run_twin
from gateway.surfaces.translate import messages as M
from gateway.surfaces.translate import responses as R
from gateway.surfaces.translate.common import SSEDecoder
from gateway.surfaces.translate.messages_stream import MessagesStream
from gateway.surfaces.translate.responses_stream import ResponsesStream

ASK = "Please call read_file on README.md."
RESP_TOOL = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}
MSG_TOOL = {"name": "read_file", "description": "Read a file", "input_schema": RESP_TOOL["parameters"]}


@pytest.fixture(scope="module")
def twin() -> Iterator[str]:
    with run_twin("tiny", time_scale=0.02) as url:
        yield url


def upstream(url: str, chat: dict[str, Any]) -> Iterator[Any]:
    """The twin's answer to ``chat``: one JSON body, or the parsed SSE payloads (then None)."""
    body = {**chat, "model": "kimi"}
    with httpx.Client(timeout=30) as client:
        if not chat["stream"]:
            r = client.post(f"{url}/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            yield r.json()
            return
        decoder = SSEDecoder()
        with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for raw in r.iter_raw():
                yield from decoder.feed(raw)
        assert decoder.done
        yield None


def test_responses_over_the_twin(twin: str) -> None:
    body = {"model": "kimi", "input": ASK, "tools": [RESP_TOOL], "max_output_tokens": 64}
    req = R.to_chat(body)
    whole = Response.model_validate(R.from_chat(next(upstream(twin, req.chat)), req, "resp_t", 1.0))
    calls = [o for o in whole.output if o.type == "function_call"]
    assert calls and calls[0].call_id.startswith("functions.read_file:")
    assert whole.usage is not None and whole.usage.input_tokens > 0

    sreq = R.to_chat({**body, "stream": True})
    stream = ResponsesStream(sreq, "resp_s", 1.0)
    events = SSEDecoder().feed(stream.start())
    for payload in upstream(twin, sreq.chat):
        events += SSEDecoder().feed(stream.feed(payload) if payload is not None else stream.finish())
    adapter = pydantic.TypeAdapter(ResponseStreamEvent)
    for event in events:
        adapter.validate_python(event)
    assert stream.saw_finish and events[-1]["type"] == "response.completed"
    final = Response.model_validate(stream.response)
    assert [o.type for o in final.output if o.type == "function_call"] == ["function_call"]
    assert final.usage is not None and final.usage.output_tokens > 0


def test_messages_over_the_twin(twin: str) -> None:
    body = {"model": "kimi", "max_tokens": 64, "messages": [{"role": "user", "content": ASK}], "tools": [MSG_TOOL]}
    req = M.to_chat(body)
    whole = Message.model_validate(M.from_chat(next(upstream(twin, req.chat)), req, "msg_t"))
    assert whole.stop_reason == "tool_use"
    assert any(b.type == "tool_use" and b.id.startswith("functions.read_file:") for b in whole.content)

    sreq = M.to_chat({**body, "stream": True})
    stream = MessagesStream(sreq, "msg_s", input_tokens=10)
    events = SSEDecoder().feed(stream.start())
    for payload in upstream(twin, sreq.chat):
        events += SSEDecoder().feed(stream.feed(payload) if payload is not None else stream.finish())
    adapter = pydantic.TypeAdapter(RawMessageStreamEvent)
    for event in events:
        adapter.validate_python(event)
    assert events[-1]["type"] == "message_stop" and events[-2]["delta"]["stop_reason"] == "tool_use"
    final = Message.model_validate(stream.message)
    assert [b.type for b in final.content if b.type == "tool_use"] == ["tool_use"]
    assert final.usage.output_tokens > 0

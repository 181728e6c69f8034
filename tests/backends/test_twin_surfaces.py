"""The twin's native Responses and Messages APIs (as SGLang 0.5.23 serves them), checked with the
official SDKs and SGLang's own protocol models; and ``routes="chat"``, a build without them."""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from backends.sim import sglang_ref
from backends.sim.testing import run_twin

READ_A = {
    "name": "Read",
    "description": "Read a file",
    "input_schema": {"type": "object", "required": ["file_path"], "properties": {"file_path": {"type": "string"}}},
}
WRITE_A = {
    "name": "Write",
    "input_schema": {
        "type": "object",
        "required": ["file_path", "content"],
        "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
    },
}
READ_R = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "required": ["path"], "properties": {"path": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with run_twin("tiny", time_scale=0.02, abort_delay_s=0.3, stream_interval_s=0.01) as u:
        yield u


def sse(resp: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    events, kind = [], ""
    for line in resp.iter_lines():
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            assert data["type"] == kind
            events.append((kind, data))
    return events


def test_root_and_openapi_list_what_is_served(url: str) -> None:
    assert httpx.head(f"{url}/").status_code == 200
    assert httpx.get(f"{url}/").json() == "SGLang is running"
    paths = httpx.get(f"{url}/openapi.json").json()["paths"]
    for path in (
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/responses/{response_id}",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/models",
    ):
        assert path in paths
    assert "post" in paths["/v1/messages"]


def test_an_old_build_serves_chat_only() -> None:
    with run_twin("tiny", time_scale=0.02, routes="chat") as u:
        assert httpx.post(f"{u}/v1/responses", json={"input": "hi"}).status_code == 404
        assert httpx.post(f"{u}/v1/messages", json={}).status_code == 404
        paths = httpx.get(f"{u}/openapi.json").json()["paths"]
        assert "/v1/chat/completions" in paths and "/v1/responses" not in paths and "/v1/messages" not in paths
    with pytest.raises(ValueError, match="route set"):
        run_twin("tiny", routes="bogus").__enter__()


def test_messages_tool_round_trip_with_the_anthropic_sdk(url: str) -> None:
    sdk = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
    first = sdk.messages.create(
        model="kimi",
        max_tokens=4000,
        tools=[WRITE_A, READ_A],  # type: ignore[list-item]
        messages=[{"role": "user", "content": "What is in this repo?"}],
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert first.stop_reason == "tool_use" and [b.type for b in first.content] == ["thinking", "tool_use"]
    use = first.content[1]
    assert use.type == "tool_use" and use.id == "functions.Read:0" and use.input == {"file_path": "README.md"}
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    history: list[Any] = [
        {"role": "user", "content": "What is in this repo?"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "# repo"}]},
    ]
    with sdk.messages.stream(model="kimi", max_tokens=32000, tools=[READ_A], messages=history) as stream:  # type: ignore[list-item]
        final = stream.get_final_message()
    assert final.stop_reason == "end_turn" and [b.type for b in final.content] == ["text"]
    assert final.usage.cache_read_input_tokens and final.usage.cache_read_input_tokens > 0
    counted = sdk.messages.count_tokens(model="kimi", messages=history, tools=[READ_A])  # type: ignore[list-item]
    assert counted.input_tokens == final.usage.input_tokens + final.usage.cache_read_input_tokens


def test_messages_stream_is_sglang_shaped(url: str) -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(sglang_ref.load_anthropic_protocol().AnthropicStreamEvent)
    body = {
        "model": "kimi",
        "max_tokens": 2000,
        "stream": True,
        "tools": [READ_A],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "look around"}]}],
    }
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219,interleaved-thinking"}
    with httpx.stream("POST", f"{url}/v1/messages?beta=true", json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200
        events = sse(r)
    for _, data in events:
        adapter.validate_python(data)
    kinds = [k for k, _ in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    start = next(d for k, d in events if k == "content_block_start")["content_block"]
    assert start == {"type": "tool_use", "id": "functions.Read:0", "name": "Read", "input": {}}
    partial = "".join(d["delta"]["partial_json"] for k, d in events if k == "content_block_delta")
    assert json.loads(partial) == {"file_path": "README.md"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use" and events[-2][1]["usage"]["output_tokens"] > 0


def test_messages_errors_use_anthropics_envelope(url: str) -> None:
    r = httpx.post(f"{url}/v1/messages", json={"model": "kimi", "messages": []})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error" and "max_tokens" in r.json()["error"]["message"]
    big = {"model": "kimi", "max_tokens": 300_000, "messages": [{"role": "user", "content": "x"}]}
    r = httpx.post(f"{url}/v1/messages", json=big)
    assert r.status_code == 400 and "context length" in r.json()["error"]["message"]


def test_responses_tool_round_trip_with_previous_response_id(url: str) -> None:
    sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
    first = sdk.responses.create(model="kimi", input="what is here?", tools=[READ_R])  # type: ignore[list-item]
    assert first.status == "completed" and [i.type for i in first.output] == ["function_call"]
    call = first.output[0]
    assert call.type == "function_call" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert json.loads(call.arguments) == {"path": "README.md"}
    second = sdk.responses.create(
        model="kimi",
        previous_response_id=first.id,
        tools=[READ_R],  # type: ignore[list-item]
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "hi"}],
    )
    assert second.status == "completed" and [i.type for i in second.output] == ["message"] and second.output_text
    assert second.usage is not None and second.usage.input_tokens_details.cached_tokens > 0
    assert sdk.responses.retrieve(second.id).id == second.id
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve("resp_missing")


def test_responses_stream_events(url: str) -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    body = {
        "model": "kimi",
        "input": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
        ],
        "stream": True,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "store": False,
    }
    with httpx.stream("POST", f"{url}/v1/responses", json=body, timeout=30) as r:
        events = sse(r)
    for _, data in events:
        adapter.validate_python(data)
    kinds = [k for k, _ in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.reasoning_summary_text.delta" in kinds and "response.output_text.delta" in kinds
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    final = events[-1][1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    text = "".join(d["delta"] for k, d in events if k == "response.output_text.delta")
    assert final["output"][1]["content"][0]["text"] == text
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    blob = final["output"][0]["encrypted_content"]  # SGLang's encode_reasoning_state: zlib + base64
    assert (
        zlib.decompress(base64.urlsafe_b64decode(blob.removeprefix("sglang-reasoning-v1."))).decode()
        == final["output"][0]["content"][0]["text"]
    )
    cut = {"model": "kimi", "input": "more", "stream": True, "max_output_tokens": 20}
    with httpx.stream("POST", f"{url}/v1/responses", json=cut, timeout=30) as r:
        last = sse(r)[-1][1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_system_message_after_the_user_turn_still_gets_a_call(url: str) -> None:
    """Claude Code puts a ``system`` message after the user's; SGLang merges it into the system prompt."""
    body = {
        "model": "kimi",
        "max_tokens": 32000,
        "tools": [READ_A],
        "system": [{"type": "text", "text": "Be a CLI."}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>x</system-reminder>"},
                    {"type": "text", "text": "what is here?"},
                ],
            },
            {"role": "system", "content": "Working directory: /srv/repo"},
        ],
    }
    r = httpx.post(f"{url}/v1/messages?beta=true", json=body, headers={"anthropic-version": "2023-06-01"}, timeout=30)
    assert r.status_code == 200 and r.json()["stop_reason"] == "tool_use"
    assert r.json()["content"][-1]["input"] == {"file_path": "README.md"}
    seen = httpx.get(f"{url}/_twin/requests").json()
    assert seen[-2]["query"] == "beta=true" and seen[-2]["headers"]["anthropic-version"] == "2023-06-01"
    assert seen[-1]["finish"] == "tool_calls" and seen[-1]["tool"] == "Read" and seen[-1]["tools"] == ["Read"]

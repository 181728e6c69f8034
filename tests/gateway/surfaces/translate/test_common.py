"""What both translated surfaces share (gateway/surfaces/translate/common.py): SSE decoding however the bytes
are cut, ids, usage counts, request bodies, chat chunk parts, and upstream error bodies in every shape."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.http.errors import GatewayError
from gateway.surfaces.translate.common import (
    ChatUsage,
    SSEDecoder,
    bad,
    chunk_parts,
    load_body,
    new_id,
    parse_arguments,
    read_upstream_error,
    sse_event,
)
from tests.translate.chat import JSON_VALUES

PAYLOADS = st.lists(st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=3), max_size=6)


@settings(max_examples=80, deadline=None)
@given(PAYLOADS, st.booleans(), st.data())
def test_decoder_gives_every_payload_however_the_bytes_are_cut(payloads: list, crlf: bool, data: st.DataObject) -> None:
    raw = b": keepalive\n\n" + b"".join(sse_event(None, p) for p in payloads) + b"data: [DONE]\n\n"
    if crlf:
        raw = raw.replace(b"\n", b"\r\n")
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=8)))
    decoder = SSEDecoder()
    out = []
    for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True):
        out += decoder.feed(raw[a:b])
    out += decoder.close()
    assert out == payloads and decoder.done and decoder.skipped == 0


def test_decoder_joins_multiline_data_and_keeps_a_last_event_without_blank_line() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'event: x\ndata: {"a":\ndata: 1}\n\n') == [{"a": 1}]
    assert decoder.feed(b"data: not json\n\n") == [] and decoder.skipped == 1
    assert decoder.feed(b'data: {"b": 2}') == []
    assert decoder.close() == [{"b": 2}]


def test_upstream_error_shapes() -> None:
    flat = read_upstream_error(
        400, b'{"object":"error","message":"m","type":"BadRequestError","param":null,"code":400}'
    )
    assert (flat.status, flat.message, flat.type, flat.code) == (400, "m", "BadRequestError", None)
    nested = read_upstream_error(404, {"error": {"message": "n", "type": "t", "param": "model", "code": "c"}})
    assert (nested.message, nested.param, nested.code) == ("n", "model", "c")
    midstream = read_upstream_error(200, {"error": "boom"})
    assert (midstream.status, midstream.message) == (502, "boom")
    assert read_upstream_error(500, b"").message == "The upstream answered HTTP 500."
    assert read_upstream_error(422, b'{"detail": "bad field"}').message == "bad field"


def test_usage_and_arguments_helpers() -> None:
    usage = ChatUsage.read(
        {
            "prompt_tokens": 10,
            "completion_tokens": 4,
            "reasoning_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 12},
        }
    )
    assert (usage.prompt, usage.cached, usage.completion, usage.reasoning) == (10, 10, 4, 2)
    assert ChatUsage.read(None) == ChatUsage()
    assert parse_arguments("") == {} and parse_arguments('{"a": 1}') == {"a": 1}
    assert parse_arguments("[1]") == {"_raw": "[1]"} and parse_arguments("{bad") == {"_raw": "{bad"}
    assert orjson.loads(sse_event("x", {"k": 1}).split(b"data: ")[1]) == {"k": 1}


def test_ids_are_prefixed_and_unique() -> None:
    ids = {new_id("resp_") for _ in range(100)}
    assert len(ids) == 100
    assert all(i.startswith("resp_") and len(i) == 37 and int(i[5:], 16) >= 0 for i in ids)


def test_sse_event_framing() -> None:
    assert sse_event(None, {"a": 1}) == b'data: {"a":1}\n\n'
    assert sse_event("ping", {"type": "ping"}) == b'event: ping\ndata: {"type":"ping"}\n\n'
    assert sse_event("x", "line\nbreak") == b'event: x\ndata: "line\\nbreak"\n\n'  # one data line, always


def test_decoder_skips_comments_and_events_without_data() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b": keepalive\n\nevent: ping\n\nid: 3\n\n") == []
    assert decoder.skipped == 0 and not decoder.done
    assert decoder.feed(b"data:[DONE]\n\n") == [] and decoder.done
    assert decoder.close() == []


def test_usage_reads_what_engines_send_and_ignores_what_is_not_a_count() -> None:
    assert ChatUsage.read(
        {"prompt_tokens": 5, "completion_tokens": 3, "completion_tokens_details": {"reasoning_tokens": 2}}
    ) == ChatUsage(5, 0, 3, 2)
    assert (
        ChatUsage.read(
            {"prompt_tokens": True, "completion_tokens": -4, "prompt_tokens_details": None, "reasoning_tokens": "2"}
        )
        == ChatUsage()
    )
    assert ChatUsage.read({"prompt_tokens": 9.5, "completion_tokens": 1}) == ChatUsage(0, 0, 1, 0)
    assert ChatUsage.read([1, 2]) == ChatUsage()


@pytest.mark.parametrize(
    ("raw", "code"),
    [(b"", "invalid_request"), (b"{oops", "invalid_json"), (b'"text"', "invalid_request"), (b"[]", "invalid_request")],
)
def test_load_body_says_what_is_wrong(raw: bytes, code: str) -> None:
    with pytest.raises(GatewayError) as err:
        load_body(raw)
    assert (err.value.status, err.value.code) == (400, code)


def test_bad_is_a_400_with_param_and_code() -> None:
    err = bad("no", "input", "unsupported_parameter")
    assert (err.status, err.message, err.param, err.code) == (400, "no", "input", "unsupported_parameter")
    assert bad("no").code == "invalid_request"


def test_chunk_parts_in_stream_order_of_the_first_choice_only() -> None:
    call = {"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}
    payload = {
        "choices": [
            {"index": 1, "delta": {"content": "other choice"}},
            "not a choice",
            {
                "index": 0,
                "delta": {"reasoning": "hm", "content": "hi", "tool_calls": [call, "junk"]},
                "finish_reason": "tool_calls",
            },
        ]
    }
    parts = list(chunk_parts(payload))
    assert parts == [("thinking", "hm"), ("text", "hi"), ("tool", call), ("finish", payload["choices"][2])]
    assert list(chunk_parts({"choices": [{"delta": {"content": "", "reasoning_content": None}}]})) == []
    assert list(chunk_parts({"usage": {"prompt_tokens": 1}, "choices": []})) == []


def test_more_upstream_error_shapes() -> None:
    anthropic = read_upstream_error(529, {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    assert (anthropic.status, anthropic.type, anthropic.message) == (529, "overloaded_error", "busy")
    assert read_upstream_error(500, b"[1, 2]").message == "The upstream answered HTTP 500."
    assert read_upstream_error(500, b"x" * 3000).message == "x" * 2000
    assert read_upstream_error(503, "  upstream connect error  ").message == "upstream connect error"
    coded = read_upstream_error(400, {"error": {"message": "m", "code": "context_length_exceeded", "type": ""}})
    assert (coded.code, coded.type) == ("context_length_exceeded", None)
    assert read_upstream_error(301, None).status == 502

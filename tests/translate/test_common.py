"""SSE decoding however the bytes are cut, and upstream error bodies in every shape."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.surfaces.translate.common import ChatUsage, SSEDecoder, parse_arguments, read_upstream_error, sse_event
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

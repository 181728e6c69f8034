"""Parsing and checking an OpenAI body, and rewriting it for the upstream hop (gateway/surfaces/openai.py):
what a parser accepts and refuses with which ``param``, the shape bounds (depth, entries, string size,
values) and where a body passes one, and the upstream body (served model, usage asked for on the
gateway's behalf, DP rank)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.http.errors import GatewayError
from gateway.surfaces import openai as oa
from gateway.surfaces.openai import ParsedRequest, check_shape, parse, upstream_body

CHAT = {"model": "kimi", "messages": [{"role": "user", "content": "hi"}]}


def _raw(**fields: Any) -> bytes:
    return orjson.dumps({**CHAT, **fields})


def _refused(raw: bytes, kind: oa.Kind = "chat") -> GatewayError:
    with pytest.raises(GatewayError) as err:
        parse(raw, kind)
    assert err.value.status == 400
    return err.value


def test_a_chat_body_parsed() -> None:
    parsed = parse(_raw(stream=True, stream_options={"include_usage": True}, max_tokens=50, top_k=3), "chat")
    assert (parsed.kind, parsed.model, parsed.stream, parsed.client_wants_usage, parsed.max_tokens) == (
        "chat",
        "kimi",
        True,
        True,
        50,
    )
    assert parsed.body["top_k"] == 3, "what the gateway does not check passes through for the engine"


@pytest.mark.parametrize(
    ("fields", "stream", "usage", "max_tokens"),
    [
        ({}, False, False, None),
        ({"stream": None}, False, False, None),
        ({"stream_options": {"include_usage": "yes"}}, False, False, None),  # only ``true`` asks for it
        ({"stream_options": None, "max_tokens": None}, False, False, None),
        ({"max_completion_tokens": 7, "max_tokens": 9}, False, False, 7),  # the newer name wins
        ({"max_completion_tokens": None, "max_tokens": 9}, False, False, 9),
    ],
)
def test_defaults_and_which_field_counts(fields: dict[str, Any], stream: bool, usage: bool, max_tokens: Any) -> None:
    parsed = parse(_raw(**fields), "chat")
    assert (parsed.stream, parsed.client_wants_usage, parsed.max_tokens) == (stream, usage, max_tokens)


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        (b"", "invalid_request", None),
        (b"{nope", "invalid_json", None),
        (b"[]", "invalid_request", None),
        (orjson.dumps({"messages": CHAT["messages"]}), "invalid_request", "model"),
        (_raw(model=""), "invalid_request", "model"),
        (_raw(stream=1), "invalid_request", "stream"),
        (_raw(stream_options=[]), "invalid_request", "stream_options"),
        (_raw(max_tokens=True), "invalid_request", "max_tokens"),
        (_raw(max_completion_tokens=-1), "invalid_request", "max_completion_tokens"),
        (_raw(max_tokens=2.5), "invalid_request", "max_tokens"),
        (_raw(messages=None), "invalid_request", "messages"),
        (_raw(messages=[]), "invalid_request", "messages"),
        (_raw(messages=["hi"]), "invalid_request", "messages[0]"),
        (_raw(messages=[{"role": "user", "content": "a"}, {"role": ""}]), "invalid_request", "messages[1].role"),
        (_raw(messages=[{"role": "user", "content": 5}]), "invalid_request", "messages[0].content"),
        (_raw(tools={"type": "function"}), "invalid_request", "tools"),
    ],
)
def test_bad_chat_bodies(raw: bytes, code: str, param: str | None) -> None:
    err = _refused(raw)
    assert (err.code, err.param) == (code, param)


def test_chat_content_may_be_null_or_parts() -> None:
    messages = [{"role": "assistant", "content": None}, {"role": "user", "content": [{"type": "text", "text": "x"}]}]
    assert parse(_raw(messages=messages), "chat").body["messages"] == messages


@pytest.mark.parametrize("prompt", ["hi", ["a", "b"], [1, 2, 3], ["a", 2], [[1, 2], [3]]])
def test_completion_prompts_accepted(prompt: Any) -> None:
    parsed = parse(orjson.dumps({"model": "kimi", "prompt": prompt}), "completion")
    assert parsed.kind == "completion" and parsed.body["prompt"] == prompt


@pytest.mark.parametrize("prompt", [None, "", [], [True], [1.5], [[1], "a"], {"text": "x"}])
def test_completion_prompts_refused(prompt: Any) -> None:
    body = {"model": "kimi"} if prompt is None else {"model": "kimi", "prompt": prompt}
    err = _refused(orjson.dumps(body), "completion")
    assert err.param == "prompt"


def test_a_chat_body_is_not_a_completion_body_nor_the_reverse() -> None:
    assert _refused(_raw(), "completion").param == "prompt"
    assert _refused(orjson.dumps({"model": "kimi", "prompt": "hi"}), "chat").param == "messages"


# ---- the shape bounds ----


def _nested(depth: int) -> dict[str, Any]:
    """A body ``depth`` levels deep (the body object is level 1)."""
    body: dict[str, Any] = {"a": 0}
    for _ in range(depth - 1):
        body = {"a": body}
    return body


def test_depth_bound() -> None:
    check_shape(_nested(oa.MAX_DEPTH))
    with pytest.raises(GatewayError) as err:
        check_shape(_nested(oa.MAX_DEPTH + 1))
    assert err.value.code == "request_too_complex" and "nested deeper than 64" in err.value.message
    assert err.value.param == ".".join(["a"] * oa.MAX_DEPTH)


def test_a_deep_body_through_parse_is_a_400_not_a_recursion_error() -> None:
    raw = b'{"model":"kimi","messages":[{"role":"user","content":"x"}],"x":' + b"[" * 200 + b"]" * 200 + b"}"
    err = _refused(raw)
    assert err.code == "request_too_complex" and err.param is not None and err.param.startswith("x[0][0]")
    assert len(err.param) <= 200


def test_string_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oa, "MAX_STRING_CHARS", 8)
    check_shape({"messages": [{"content": "x" * 8}]})
    with pytest.raises(GatewayError) as err:
        check_shape({"messages": [{"content": "x" * 9}]})
    assert err.value.param == "messages[0].content" and "a string of 9 characters (limit 8)" in err.value.message
    with pytest.raises(GatewayError):
        check_shape("x" * 9)  # a bare string body


def test_entries_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oa, "MAX_ITEMS", 4)
    check_shape({"prompt": [1, 2, 3, 4]})
    with pytest.raises(GatewayError) as err:
        check_shape({"prompt": [1, 2, 3, 4, 5]})
    assert err.value.param == "prompt" and "5 entries" in err.value.message


def test_values_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oa, "MAX_VALUES", 20)
    check_shape({"a": list(range(18))})  # 20 values: the object, the array, 18 numbers
    with pytest.raises(GatewayError) as err:
        check_shape({"model": "m", "x": [0] * 9, "y": [0] * 9, "z": [0] * 5})
    assert err.value.code == "request_too_complex" and "more than 20 JSON values" in err.value.message


def test_values_bound_holds_whatever_the_order_of_the_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oa, "MAX_ITEMS", 10)
    monkeypatch.setattr(oa, "MAX_VALUES", 20)
    # Scaled down: with the real bounds, {"x": ["s"] * 999_999 + [["s"] * 999_999 + [[0] * 1_000_000]], ...}.
    body = {"x": ["s"] * 9 + [["s"] * 9 + [[0] * 10]], "model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert not oa._within_bounds(body), "37 values: the first walk sees the bound passed"
    with pytest.raises(GatewayError):
        check_shape(body)


# ---- the upstream body ----


def _parsed(**fields: Any) -> ParsedRequest:
    return parse(_raw(**fields), "chat")


def test_a_stream_asks_for_usage_on_the_gateways_behalf() -> None:
    req = _parsed(stream=True, stream_options={"continuous_usage_stats": False})
    raw, injected = upstream_body(req, "served/kimi")
    body = orjson.loads(raw)
    assert injected and body["model"] == "served/kimi"
    assert body["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert req.body["stream_options"] == {"continuous_usage_stats": False}, "the client's body is not changed"
    assert req.body["model"] == "kimi" and "routed_dp_rank" not in body


def test_no_injection_when_the_client_asked_or_did_not_stream() -> None:
    raw, injected = upstream_body(_parsed(stream=True, stream_options={"include_usage": True}), "s")
    assert not injected and orjson.loads(raw)["stream_options"] == {"include_usage": True}
    raw, injected = upstream_body(_parsed(), "s")
    assert not injected and "stream_options" not in orjson.loads(raw)


@pytest.mark.parametrize("rank", [0, 3])
def test_the_dp_rank_is_pinned(rank: int) -> None:
    raw, _ = upstream_body(_parsed(temperature=0.1), "s", rank=rank)
    body = orjson.loads(raw)
    assert body["routed_dp_rank"] == rank and body["temperature"] == 0.1

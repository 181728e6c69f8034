"""Whatever JSON a client sends, parsing and fingerprinting end in a 4xx or a request: never a crash."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.http.errors import GatewayError
from gateway.surfaces.openai import parse, upstream_body
from policies.prefix import request_fingerprint

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
message = st.fixed_dictionaries(
    {},
    optional={
        "role": json_values | st.sampled_from(["user", "assistant", "tool"]),
        "content": json_values,
        "tool_calls": json_values,
        "name": json_values,
        "tool_call_id": json_values,
    },
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["kimi", ""]) | json_values,
        "messages": st.lists(message | json_values, max_size=4) | json_values,
        "prompt": json_values,
        "stream": json_values,
        "stream_options": json_values,
        "max_tokens": json_values,
        "max_completion_tokens": json_values,
        "tools": json_values,
    },
)


@pytest.mark.slow  # > 5 s here
@settings(max_examples=400, deadline=None)
@given(bodies, st.sampled_from(["chat", "completion"]))
def test_any_body_is_a_request_or_a_400(body: dict[str, object], kind: str) -> None:
    raw = json.dumps(body).encode()  # the stdlib: it writes integers orjson refuses, as a client may
    try:
        req = parse(raw, kind)  # type: ignore[arg-type]
    except GatewayError as err:
        assert err.status == 400 and err.message
        return
    fingerprint, size = request_fingerprint(req.body, 0.25)
    assert size >= 0 and all(tokens >= 1 for _, tokens in fingerprint)
    upstream_body(req, "served", rank=1)


@given(st.binary(max_size=64))
def test_any_bytes_are_a_request_or_a_400(raw: bytes) -> None:
    try:
        parse(raw, "chat")
    except GatewayError as err:
        assert err.status == 400

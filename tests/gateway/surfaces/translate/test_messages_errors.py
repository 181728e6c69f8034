"""Anthropic's error envelope on /v1/messages (gateway/surfaces/translate/messages_errors.py): the error type
for a status or a refusal code, checked with the Anthropic SDK's own type, and upstream errors of every
shape re-shaped into it with their status kept."""

from __future__ import annotations

import orjson
import pytest
from anthropic.types.shared import ErrorResponse

from gateway.surfaces.translate.messages_errors import (
    CODE_ERROR_TYPES,
    ERROR_TYPES,
    error_body,
    error_envelope,
    error_type,
    reshape_upstream_error,
)


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (400, None, "invalid_request_error"),
        (401, None, "authentication_error"),
        (403, None, "permission_error"),
        (404, None, "not_found_error"),
        (413, None, "request_too_large"),
        (429, "team_queue_full", "rate_limit_error"),
        (429, "team_token_rate", "rate_limit_error"),
        (503, "queue_timeout", "overloaded_error"),
        (503, "no_healthy_backend", "overloaded_error"),
        (500, None, "api_error"),
        (502, None, "api_error"),
        (503, None, "overloaded_error"),
        (529, None, "overloaded_error"),
        (504, None, "timeout_error"),
    ],
)
def test_error_types(status: int, code: str | None, kind: str) -> None:
    body = orjson.loads(error_body(status, "why", code))
    assert body == {"type": "error", "error": {"type": kind, "message": "why"}}
    if kind != "request_too_large":  # documented by Anthropic, absent from the SDK's union
        ErrorResponse.model_validate(body)


@pytest.mark.parametrize(
    ("status", "kind"),
    [(418, "invalid_request_error"), (422, "invalid_request_error"), (501, "api_error"), (599, "api_error")],
)
def test_a_status_without_a_type_of_its_own_falls_back_by_class(status: int, kind: str) -> None:
    assert status not in ERROR_TYPES
    assert error_type(status) == kind


def test_a_refusal_code_overrides_the_status_and_an_unknown_code_does_not() -> None:
    for code, kind in CODE_ERROR_TYPES.items():
        assert error_type(400, code) == kind  # whatever the status the refusal came with
    assert error_type(503, "queue_timeout") == "overloaded_error"
    assert error_type(401, "invalid_api_key") == "authentication_error"  # not a refusal code: the status decides
    assert error_envelope(504, "slow", "upstream_timeout") == {
        "type": "error",
        "error": {"type": "timeout_error", "message": "slow"},
    }


def test_upstream_errors_take_anthropics_envelope_with_status_kept() -> None:
    flat = b'{"object":"error","message":"prompt too long","type":"BadRequestError","param":null,"code":400}'
    assert reshape_upstream_error(400, flat) == (
        400,
        orjson.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt too long"}}),
    )
    native = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    status, body = reshape_upstream_error(500, native)
    assert status == 500 and orjson.loads(body)["error"] == {"type": "overloaded_error", "message": "busy"}


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        # OpenAI's nested envelope: its type is not Anthropic's, so the status decides
        (429, {"error": {"message": "slow down", "type": "requests", "code": "rate_limit"}}, (429, "rate_limit_error")),
        # plain text from a proxy in front of the engine
        (502, b"Bad Gateway\n", (502, "api_error")),
        # a mid-stream error arrives under 200: reported as a 502
        (200, {"error": "engine died"}, (502, "api_error")),
        # an Anthropic type the upstream chose is kept even where the status says otherwise
        (400, {"type": "error", "error": {"type": "permission_error", "message": "m"}}, (400, "permission_error")),
    ],
)
def test_upstream_errors_of_every_shape(status: int, body: object, expected: tuple[int, str]) -> None:
    got_status, raw = reshape_upstream_error(status, body)  # type: ignore[arg-type]
    envelope = orjson.loads(raw)
    assert (got_status, envelope["error"]["type"]) == expected
    assert envelope["type"] == "error" and envelope["error"]["message"]
    ErrorResponse.model_validate(envelope)


def test_an_empty_upstream_body_still_says_what_happened() -> None:
    status, raw = reshape_upstream_error(503, b"")
    assert status == 503
    assert orjson.loads(raw)["error"] == {"type": "overloaded_error", "message": "The upstream answered HTTP 503."}

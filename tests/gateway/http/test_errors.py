"""The OpenAI error envelope (gateway/http/errors.py): every error the gateway makes, its ``type`` by
status, the bytes of its body and the Starlette response it becomes."""

from __future__ import annotations

import orjson
import pytest

from gateway.http.errors import GatewayError, envelope, error_body, error_response


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "invalid_request_error"),
        (408, "timeout_error"),
        (413, "invalid_request_error"),
        (429, "rate_limit_error"),
        (431, "invalid_request_error"),
        (500, "server_error"),
        (502, "upstream_error"),
        (503, "service_unavailable"),
        (504, "timeout_error"),
    ],
)
def test_the_type_follows_the_status(status: int, kind: str) -> None:
    assert envelope(status, "m")["error"]["type"] == kind


def test_a_status_without_a_type_of_its_own_is_a_server_error() -> None:
    assert envelope(418, "teapot")["error"]["type"] == "server_error"
    assert envelope(599, "odd", "c")["error"] == {"message": "odd", "type": "server_error", "param": None, "code": "c"}


def test_the_envelope_always_has_its_four_fields() -> None:
    """OpenAI's clients read ``message``, ``type``, ``param`` and ``code``: all four are present, the
    unset ones as null, never left out."""
    assert envelope(400, "bad") == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": None}
    }
    assert envelope(400, "bad", "invalid_value", "messages")["error"] == {
        "message": "bad",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "invalid_value",
    }


def test_the_body_is_compact_json_of_the_envelope() -> None:
    body = error_body(429, 'quota "a" \u00e9', "team_token_rate")
    assert isinstance(body, bytes)
    assert orjson.loads(body) == envelope(429, 'quota "a" \u00e9', "team_token_rate")
    assert b": " not in body and b", " not in body  # one compact line (the relay writes it into SSE events too)


def test_a_gateway_error_keeps_what_it_was_given() -> None:
    err = GatewayError(503, "busy", "overloaded", None, {"retry-after": "1"})
    assert (err.status, err.message, err.code, err.param, err.headers) == (
        503,
        "busy",
        "overloaded",
        None,
        {"retry-after": "1"},
    )
    assert str(err) == "busy" and isinstance(err, Exception)
    plain, other = GatewayError(400, "a"), GatewayError(400, "b")
    assert plain.headers == {} and plain.code is None and plain.param is None
    plain.headers["x"] = "1"
    assert other.headers == {}, "each error has headers of its own (no shared default)"


def test_the_response_carries_status_body_type_and_headers() -> None:
    response = error_response(GatewayError(401, "no key", "missing_api_key", headers={"www-authenticate": "Bearer"}))
    assert response.status_code == 401
    assert response.media_type == "application/json"
    assert response.headers["content-type"] == "application/json"
    assert response.headers["www-authenticate"] == "Bearer"
    assert int(response.headers["content-length"]) == len(response.body)
    assert orjson.loads(response.body) == {
        "error": {"message": "no key", "type": "authentication_error", "param": None, "code": "missing_api_key"}
    }

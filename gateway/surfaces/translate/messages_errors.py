"""Anthropic's error envelope on /v1/messages: the error type for an HTTP status or a cachegate
refusal code, and an upstream error re-shaped into it with its status kept."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.surfaces.translate.common import read_upstream_error

# HTTP status → Anthropic error type; the gateway's refusal codes override it where they say more.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
CODE_ERROR_TYPES = {
    "team_queue_full": "rate_limit_error",
    "team_token_rate": "rate_limit_error",
    "queue_timeout": "overloaded_error",
    "no_healthy_backend": "overloaded_error",
}


def error_type(status: int, code: str | None = None) -> str:
    """The Anthropic error type for an HTTP status (a cachegate refusal code can refine it)."""
    if code in CODE_ERROR_TYPES:
        return CODE_ERROR_TYPES[code]
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_envelope(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(status, code), "message": message}}


def error_body(status: int, message: str, code: str | None = None) -> bytes:
    """Anthropic's error envelope; the gateway also sends ``code`` as header ``x-cachegate-code``."""
    return orjson.dumps(error_envelope(status, message, code))


def reshape_upstream_error(status: int, body: bytes | dict[str, Any] | str | None) -> tuple[int, bytes]:
    """An upstream error (SGLang's flat shape, OpenAI's, Anthropic's, or text) → Anthropic's
    envelope, status kept."""
    err = read_upstream_error(status, body)
    kind = err.type if err.type in _ANTHROPIC_TYPES else error_type(err.status)
    return err.status, orjson.dumps({"type": "error", "error": {"type": kind, "message": err.message}})


_ANTHROPIC_TYPES = frozenset(ERROR_TYPES.values())

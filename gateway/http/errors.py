"""OpenAI error envelopes: every error the gateway makes goes through here."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class GatewayError(Exception):
    """An error answered to the client in the OpenAI envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}


def envelope(status: int, message: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}}


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> bytes:
    return orjson.dumps(envelope(status, message, code, param))


def error_response(err: GatewayError) -> Response:
    return Response(
        error_body(err.status, err.message, err.code, err.param),
        status_code=err.status,
        media_type="application/json",
        headers=err.headers,
    )

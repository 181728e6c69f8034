"""Parse and check an OpenAI request body; rewrite it for the upstream hop.

Only what the gateway needs is checked here (model, messages or prompt, stream, max_tokens,
stream_options); everything else passes through for the engine to judge, once its shape is
bounded (``check_shape``): nesting depth, array and object sizes, string sizes and the total number
of JSON values. A body past a bound is a 400 ``request_too_complex`` (never a 500 from a
re-serialisation deeper than orjson's 255 levels, nor a recursion error while rendering).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.http.errors import GatewayError
from gateway.surfaces.translate.common import load_body

Kind = Literal["chat", "completion"]

MAX_OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens")

MAX_DEPTH = 64
"""Nesting levels of the body (the body object is level 1). Real requests stay far below: a tool's
JSON schema nests about two levels per schema level; orjson writes at most 254."""
MAX_ITEMS = 1_000_000
"""Entries of one array or object (a 262k-token prompt given as token ids is 262k entries)."""
MAX_STRING_CHARS = 16 * 1024 * 1024
"""Characters of one string (16 Mi: about 4M tokens, past any context window)."""
MAX_VALUES = 2_000_000
"""JSON values in the whole body (bounds the walk and the memory a small body can expand into)."""


@dataclass(slots=True)
class ParsedRequest:
    kind: Kind
    body: dict[str, Any]
    model: str
    stream: bool
    client_wants_usage: bool
    max_tokens: int | None


def _bad(message: str, param: str | None = None, code: str = "invalid_request") -> GatewayError:
    return GatewayError(400, message, code, param)


def parse(raw: bytes, kind: Kind) -> ParsedRequest:
    body = load_body(raw)
    check_shape(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a non-empty string.", "model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean.", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("'stream_options' must be an object.", "stream_options")
    wants_usage = bool(options and options.get("include_usage") is True)
    max_tokens = None
    for field in MAX_OUTPUT_FIELDS:
        value = body.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _bad(f"'{field}' must be a positive integer.", field)
        max_tokens = value
        break
    # The prompt's size is the fingerprint's to measure (gateway/request/lifecycle.py renders it anyway):
    # these only check its shape.
    if kind == "chat":
        _check_messages(body)
    else:
        _check_prompt(body)
    return ParsedRequest(kind, body, model, stream, wants_usage, max_tokens)


def _check_messages(body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _bad("'messages' is required and must be an array.", "messages")
    if not messages:
        raise _bad("'messages' must contain at least one message.", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _bad(f"'messages[{i}]' must be an object.", f"messages[{i}]")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise _bad(f"'messages[{i}].role' is required and must be a string.", f"messages[{i}].role")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise _bad(f"'messages[{i}].content' must be a string, an array or null.", f"messages[{i}].content")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _bad("'tools' must be an array.", "tools")


def _check_prompt(body: dict[str, Any]) -> None:
    prompt = body.get("prompt")
    if prompt is None:
        raise _bad("'prompt' is required.", "prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise _bad("'prompt' must not be empty.", "prompt")
        return
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(p, str | int) and not isinstance(p, bool) for p in prompt)
    ):
        return
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        return
    raise _bad("'prompt' must be a non-empty string, array of strings or array of token ids.", "prompt")


def check_shape(body: Any) -> None:
    """Raise 400 ``request_too_complex`` when ``body`` passes a bound (``MAX_*`` above).

    Iterative (no recursion, so any depth orjson parsed is safe to walk). A first walk visits the
    containers only and builds no paths; the walk that names where a bound was passed runs only
    when that one finds something. That one counts values as it pops them, so it may come short of the
    first's count: the request is refused all the same, without a path."""
    if not _within_bounds(body):
        _name_the_breach(body)
        raise _too_complex(f"more than {MAX_VALUES} JSON values", "")


def _within_bounds(body: Any) -> bool:
    if isinstance(body, str):
        return len(body) <= MAX_STRING_CHARS
    if not isinstance(body, dict | list):
        return True
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(body, 1)]
    values = 1  # every value seen so far, counted when its container is (never below the exact walk's)
    while stack:
        value, depth = stack.pop()
        size = len(value)
        if depth > MAX_DEPTH or size > MAX_ITEMS:
            return False
        values += size
        if values > MAX_VALUES:
            return False
        for item in value.values() if isinstance(value, dict) else value:
            if isinstance(item, str):
                if len(item) > MAX_STRING_CHARS:
                    return False
            elif isinstance(item, dict | list):
                stack.append((item, depth + 1))
    return True


def _name_the_breach(body: Any) -> None:
    stack: list[tuple[Any, int, str]] = [(body, 1, "")]
    values = 0
    while stack:
        value, depth, path = stack.pop()
        values += 1
        if isinstance(value, str):
            if len(value) > MAX_STRING_CHARS:
                raise _too_complex(f"a string of {len(value)} characters (limit {MAX_STRING_CHARS})", path)
            continue
        if not isinstance(value, dict | list):
            continue
        if depth > MAX_DEPTH:
            raise _too_complex(f"JSON nested deeper than {MAX_DEPTH} levels", path)
        if len(value) > MAX_ITEMS:
            raise _too_complex(f"{len(value)} entries in one array or object (limit {MAX_ITEMS})", path)
        if values + len(value) > MAX_VALUES:
            raise _too_complex(f"more than {MAX_VALUES} JSON values", path)
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, dict | list | str):
                    stack.append((item, depth + 1, f"{path}.{key}" if path else str(key)))
                else:
                    values += 1
        else:
            for i, item in enumerate(value):
                if isinstance(item, dict | list | str):
                    stack.append((item, depth + 1, f"{path}[{i}]"))
                else:
                    values += 1


def _too_complex(what: str, path: str) -> GatewayError:
    return GatewayError(400, f"The request body is too complex: {what}.", "request_too_complex", path[:200] or None)


def upstream_body(req: ParsedRequest, upstream_model: str, *, rank: int | None = None) -> tuple[bytes, bool]:
    """The body sent upstream, and whether the gateway injected ``include_usage`` on its own behalf."""
    body = dict(req.body)
    body["model"] = upstream_model
    injected = False
    if req.stream and not req.client_wants_usage:
        options = dict(body.get("stream_options") or {})
        options["include_usage"] = True
        body["stream_options"] = options
        injected = True
    if rank is not None:
        body["routed_dp_rank"] = rank
    try:
        return orjson.dumps(body), injected
    except (TypeError, orjson.JSONEncodeError):  # unreachable after check_shape; never a 500
        raise _too_complex("a value that cannot be re-encoded", "") from None

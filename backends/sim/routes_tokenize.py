"""``POST /v1/tokenize`` (and ``/tokenize``): SGLang 0.5.23's tokenizer endpoint on the twin.

Body as SGLang's ``TokenizeRequest``: ``prompt`` (a string) or ``messages`` (+ ``tools``), rendered with
the twin's chat template as a chat completion would be (``add_generation_prompt`` omitted: true).
Answer as ``TokenizeResponse``: ``tokens``, ``count``, ``max_model_len``. The twin's token is 4 bytes of
UTF-8 (``backends/sim/tokenizer.py``); its id is those bytes as a little-endian uint32 (the last token
zero-padded), so the ids hash to the very block hashes the twin's KV events publish.
"""

from __future__ import annotations

import struct
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from backends.sim.chat_template import TemplateError, render_chat
from backends.sim.httpio import json_response, validation_error
from backends.sim.runtime import MAX_MODEL_LEN
from backends.sim.tokenizer import BYTES_PER_TOKEN


def token_ids(text: str) -> list[int]:
    data = text.encode()
    pad = -len(data) % BYTES_PER_TOKEN
    data += b"\0" * pad
    return list(struct.unpack(f"<{len(data) // 4}I", data))


async def tokenize(request: Request) -> Response:
    try:
        body: Any = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return validation_error("Invalid JSON body")
    if not isinstance(body, dict):
        return validation_error("Input should be a valid dictionary")
    prompt, messages = body.get("prompt"), body.get("messages")
    try:
        if isinstance(messages, list):
            generation = body.get("add_generation_prompt", True)
            text = render_chat(messages, body.get("tools"), add_generation_prompt=generation is not False)
        elif isinstance(prompt, str):
            text = prompt
        else:
            return validation_error("Either prompt or messages is required")
    except TemplateError as exc:
        return validation_error(str(exc))
    ids = token_ids(text)
    return json_response({"tokens": ids, "count": len(ids), "max_model_len": MAX_MODEL_LEN})

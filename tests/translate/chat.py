"""Shared pieces for the translation tests: a hypothesis strategy for one assistant turn as an
upstream would produce it, the chat chunks (arbitrarily fragmented) and the completion for it, and
a loopback server that answers the official SDKs through the translators."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvicorn
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.fake_upstream import free_port

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)
NAMES = st.sampled_from(["read_file", "list_dir", "grep", "run_tests", "apply_patch"])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


@dataclass
class Call:
    id: str
    name: str
    arguments: str


@dataclass
class Turn:
    """One assistant turn: what a chat completion says, however it is cut into chunks."""

    reasoning: str = ""
    content: str = ""
    calls: list[Call] = field(default_factory=list)
    finish: str = "stop"
    usage: dict[str, Any] = field(default_factory=dict)

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.calls
            ]
        return msg

    def completion(self) -> dict[str, Any]:
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "served/kimi",
            "choices": [{"index": 0, "message": self.message(), "finish_reason": self.finish, "matched_stop": None}],
            "usage": self.usage,
        }


@st.composite
def turns(draw: st.DrawFn) -> Turn:
    calls = []
    for i in range(draw(st.integers(0, 3))):
        name = draw(NAMES)
        # Kimi's ids are functions.NAME:IDX; other engines' look like call_…: both must survive.
        call_id = draw(st.sampled_from([f"functions.{name}:{i}", f"call_{i}abc", f"toolu_{i}"]))
        args = orjson.dumps(draw(st.dictionaries(TEXT, JSON_VALUES, max_size=3))).decode()
        if draw(st.booleans()):
            args = args.replace(",", ", ").replace(":", ": ")  # the spacing models actually produce
        calls.append(Call(call_id, name, args))
    reasoning = draw(TEXT)
    content = draw(TEXT)
    finish = "tool_calls" if calls else draw(st.sampled_from(["stop", "length"]))
    prompt = draw(st.integers(1, 200_000))
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": draw(st.integers(0, 5000)),
        "prompt_tokens_details": {"cached_tokens": draw(st.integers(0, prompt))},
    }
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return Turn(reasoning, content, calls, finish, usage)


def pieces(draw: st.DrawFn, text: str) -> list[str]:
    """``text`` cut at arbitrary points (empty pieces included: upstreams send those too)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=6)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "served/kimi",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": None}],
        "usage": None,
    }


def chunks_for(draw: st.DrawFn, turn: Turn) -> list[dict[str, Any]]:
    """The chat SSE payloads an upstream could send for ``turn``: every text and every tool call's
    arguments split at arbitrary points, the id and name in the call's first fragment."""
    out = [_chunk({"role": "assistant", "content": ""})]
    out += [_chunk({"reasoning_content": p}) for p in pieces(draw, turn.reasoning) if p]
    out += [_chunk({"content": p}) for p in pieces(draw, turn.content) if p]
    for i, call in enumerate(turn.calls):
        frags = pieces(draw, call.arguments)
        out.append(
            _chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": frags[0]},
                        }
                    ]
                }
            )
        )
        out += [_chunk({"tool_calls": [{"index": i, "function": {"arguments": f}}]}) for f in frags[1:]]
    out.append(_chunk({}, turn.finish))
    out.append(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "served/kimi",
            "choices": [],
            "usage": turn.usage,
        }
    )
    return out


class SDKServer:
    """A loopback HTTP server whose handlers the test sets; the official SDKs talk to it."""

    def __init__(self) -> None:
        self.handler: Callable[[Request], Any] | None = None
        self.requests: list[dict[str, Any]] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

        async def endpoint(request: Request) -> Response:
            raw = await request.body()
            self.requests.append(
                {"path": request.url.path, "body": orjson.loads(raw) if raw else None, "headers": dict(request.headers)}
            )
            assert self.handler is not None
            return await self.handler(request)

        routes = [
            Route(p, endpoint, methods=["POST"]) for p in ("/v1/responses", "/v1/messages", "/v1/messages/count_tokens")
        ]
        config = uvicorn.Config(
            Starlette(routes=routes), host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the SDK test server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def sse(events: Iterator[bytes]) -> StreamingResponse:
    async def body() -> Any:
        for event in events:
            yield event
            await asyncio.sleep(0)

    return StreamingResponse(body(), media_type="text/event-stream")

"""What a request has produced so far, cut into reasoning and content pieces: shared by the
surfaces that reshape the twin's output (Messages, Responses). Chat and completions keep their
own byte-exact chunking in ``routes_openai``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from backends.sim.runtime import Live, Twin


def final_parts(live: Live, n: int) -> tuple[str | None, str]:
    """(reasoning or None, content) of a request that generated ``n`` tokens (content is empty
    for a tool-call answer: its markup is not text)."""
    r_tokens = min(n, live.reasoning_tokens)
    reasoning = live.reasoning[: 4 * r_tokens] if live.reasoning else None
    content = "" if live.tool_calls else live.content[: 4 * (n - r_tokens)]
    return reasoning, content


def _cut(live: Live, upto: int) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    lo, hi, r_tokens = live.sent, upto, live.reasoning_tokens
    if lo >= hi:
        return out
    if lo < r_tokens:
        out.append(("reasoning", live.reasoning[4 * lo : 4 * min(hi, r_tokens)]))
    if hi > r_tokens and not live.tool_calls:
        a, b = max(lo, r_tokens) - r_tokens, hi - r_tokens
        out.append(("content", live.content[4 * a : 4 * b]))
    live.sent = hi
    return out


async def pieces(t: Twin, live: Live) -> AsyncIterator[tuple[str, str]]:
    """``("reasoning" | "content", text)`` as the engine generates it, until the request ends
    (then ``live.done`` holds its finished event)."""
    while not live.done.done():
        for piece in _cut(live, t.generated(live)):
            yield piece
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(live.done), t.stream_interval_s)
    for piece in _cut(live, live.done.result().completion_tokens):
        yield piece

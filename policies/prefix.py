"""The prefix fingerprint: chained hashes over fixed-size blocks of a canonical rendering.

The live gateway has no tokenizer, so it fingerprints bytes: ``render(body)`` turns a parsed chat
or completion request into one canonical byte string (tools first, then every message in order:
role, content, tool calls, tool call id, name; never only the first message), and
``fingerprint(data, tokens_per_byte)`` cuts it into ``BLOCK_BYTES`` blocks, each keyed by a hash of
*all* bytes up to its end (so equal keys mean equal prefixes) and carrying its estimated tokens.
``request_fingerprint(body, tokens_per_byte)`` gives the same result (plus the rendered length, for
token estimates) while hashing the rendering piece by piece, never joining it whole: the entry point
for the gateway (``loadtest/bench/fingerprint.py`` times it on long requests).

Block size: 1 KiB, about 256 tokens at Kimi's ~4 bytes per token. Small enough that a turn's new
tool result (a few thousand tokens) adds about ten blocks and a prefix match loses at most 256
tokens at its end; large enough that a 160k-token prompt is 640 blocks (a 2 ms budget). A changed
message changes the block holding its first changed byte and every block after it, nothing before.

The simulator builds fingerprints from the workload's block ids instead (``from_blocks``); those
blocks have other sizes (512 or 1024 tokens, shorter at segment ends), so nothing downstream may
assume a block size: every block carries its own token count.
"""

from __future__ import annotations

import hashlib
from collections.abc import Container, Iterable, Iterator, Mapping
from operator import itemgetter
from typing import Any

import orjson

from policies.types import Fingerprint

BLOCK_BYTES = 1024
"""Bytes per fingerprint block (about 256 tokens)."""

# Separators (ASCII record and unit separators, escaped in JSON and rare in text): one before
# each message, one between its fields.
_MSG = b"\x1e"
_FIELD = b"\x1f"
_DUMP_OPTS = orjson.OPT_SORT_KEYS


def _dump(value: Any) -> bytes:
    return orjson.dumps(value, option=_DUMP_OPTS)


def _canon(value: Any, out: list[bytes]) -> None:
    """Append a small JSON value canonically (sorted keys). Used for the many small objects inside
    messages (tool calls, non-text parts): one ``orjson.dumps`` per object measured far slower than
    this once the big content strings are allocated."""
    if isinstance(value, str):
        out += (b'"', value.encode("utf-8", "surrogatepass"), b'"')
    elif isinstance(value, Mapping):
        out.append(b"{")
        for key in sorted(value):
            out += (str(key).encode("utf-8", "surrogatepass"), b":")
            _canon(value[key], out)
            out.append(b",")
        out.append(b"}")
    elif isinstance(value, list | tuple):
        out.append(b"[")
        for item in value:
            _canon(item, out)
            out.append(b",")
        out.append(b"]")
    elif value is None or isinstance(value, bool):
        out.append(b"null" if value is None else b"true" if value else b"false")
    elif isinstance(value, int | float):
        out.append(repr(value).encode())
    else:
        out.append(_dump(value))


def _content(value: Any, out: list[bytes]) -> None:
    """Append a message's content: a string as UTF-8; text parts as their text; other parts as
    sorted JSON (pieces go straight into ``out``: one copy of the bytes, at the final join)."""
    if value is None:
        return
    if isinstance(value, str):
        out.append(value.encode("utf-8", "surrogatepass"))
        return
    if not isinstance(value, list):
        _canon(value, out)
        return
    for i, part in enumerate(value):
        if i:
            out.append(_FIELD)
        if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
            out.append(part["text"].encode("utf-8", "surrogatepass"))
        elif isinstance(part, str):
            out.append(part.encode("utf-8", "surrogatepass"))
        else:
            _canon(part, out)


_MESSAGE_FIELDS = tuple(
    (key, _FIELD + key.encode() + b"=") for key in ("reasoning_content", "tool_calls", "tool_call_id", "name")
)
_HEADERS = {role: _MSG + role.encode() + _FIELD for role in ("system", "developer", "user", "assistant", "tool")}
"""Each common role's message header, built once."""
_OWN_PIECE = 4096
"""Content at least this long is a piece of its own (hashed as is, never copied); shorter pieces are
joined, up to ``_BATCH`` of them at a time: a piece costs more to hand over than 4 KB cost to copy."""
_BATCH = 64


def _chat_pieces(body: Mapping[str, Any]) -> Iterator[bytes]:
    """The canonical rendering of a chat request as pieces (tools first, then small messages batched,
    long contents alone), so a consumer can hash it without ever holding (or copying) the whole rendering."""
    tools = body.get("tools")
    if tools:
        yield b"tools" + _FIELD + _dump(tools)
    small: list[bytes] = []
    for msg in body.get("messages") or ():
        if type(msg) is not dict and not isinstance(msg, Mapping):
            small.append(_MSG)
            _canon(msg, small)
            continue
        role = msg.get("role", "")
        header = _HEADERS.get(role) if type(role) is str else None
        small.append(header if header is not None else _MSG + str(role).encode() + _FIELD)
        content = msg.get("content")
        if isinstance(content, str):  # the common case: a long one is hashed as is, never copied
            data = content.encode("utf-8", "surrogatepass")
            if len(data) >= _OWN_PIECE:
                yield b"".join(small)
                small.clear()
                yield data
            else:
                small.append(data)
        elif content is not None:
            _content(content, small)
        if len(msg) > 2 or "content" not in msg or "role" not in msg:  # anything beyond role and content
            for key, tag in _MESSAGE_FIELDS:
                value = msg.get(key)
                if value is not None:
                    small.append(tag)
                    _canon(value, small)
        if len(small) >= _BATCH:
            yield b"".join(small)
            small.clear()
    if small:
        yield b"".join(small)


def render_chat(body: Mapping[str, Any]) -> bytes:
    """Canonical bytes of a chat request: tools, then every message in order."""
    return b"".join(_chat_pieces(body))


def render_completion(body: Mapping[str, Any]) -> bytes:
    """Canonical bytes of a completion request's prompt (a string, strings, or token ids)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt.encode("utf-8", "surrogatepass")
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return _MSG.join(p.encode("utf-8", "surrogatepass") for p in prompt)
    return _dump(prompt)


def render(body: Mapping[str, Any]) -> bytes:
    """Canonical bytes of a parsed request body: chat when it has ``messages``, else completion."""
    return render_chat(body) if "messages" in body else render_completion(body)


def fingerprint(data: bytes, tokens_per_byte: float, block_bytes: int = BLOCK_BYTES) -> Fingerprint:
    """Chained block hashes of ``data`` with each block's estimated tokens.

    Key of block i = the first 8 bytes of SHA-1 over ``data[: (i+1)·block_bytes]`` (an incremental
    hash, copied at each block end: one pass over the bytes; SHA-1 because it is the fastest
    hashlib digest measured here, and only accidental collisions matter). Tokens of block i =
    ``round(end·r) − round(start·r)`` with ``r = tokens_per_byte`` (at least 1), so the blocks add
    up to ``round(len(data)·r)`` however the data is cut.
    """
    h = hashlib.sha1()
    view = memoryview(data)
    out: list[tuple[int, int]] = []
    prev_tokens = 0
    from_bytes = int.from_bytes
    for start in range(0, len(data), block_bytes):
        end = min(start + block_bytes, len(data))
        h.update(view[start:end])
        tokens = round(end * tokens_per_byte)
        out.append((from_bytes(h.copy().digest()[:8], "little"), max(1, tokens - prev_tokens)))
        prev_tokens = tokens
    return tuple(out)


def _stream_fingerprint(pieces: Iterable[bytes], tokens_per_byte: float, block_bytes: int) -> tuple[Fingerprint, int]:
    """``fingerprint`` over a rendering given as pieces, never joined: equal to
    ``fingerprint(b"".join(all pieces))`` (joining a long rendering costs more than the hashing: the
    fresh buffer's page faults), plus the total length."""
    h = hashlib.sha1()
    update, from_bytes = h.update, int.from_bytes
    out: list[tuple[int, int]] = []
    room = block_bytes  # bytes left in the current block
    total = prev_tokens = 0
    for piece in pieces:
        n = len(piece)
        if n < room:
            update(piece)
            room -= n
            total += n
            continue
        view = memoryview(piece)
        i = 0
        while n - i >= room:
            update(view[i : i + room])
            i += room
            total += room
            tokens = round(total * tokens_per_byte)
            out.append((from_bytes(h.copy().digest()[:8], "little"), max(1, tokens - prev_tokens)))
            prev_tokens = tokens
            room = block_bytes
        if i < n:
            update(view[i:])
            room -= n - i
            total += n - i
    if room < block_bytes:  # the last block: nothing follows, so no copy of the hash
        tokens = round(total * tokens_per_byte)
        out.append((from_bytes(h.digest()[:8], "little"), max(1, tokens - prev_tokens)))
    return tuple(out), total


def request_fingerprint(
    body: Mapping[str, Any], tokens_per_byte: float, block_bytes: int = BLOCK_BYTES
) -> tuple[Fingerprint, int]:
    """``(fingerprint, rendered bytes)`` of a parsed request body (the bytes feed token estimates):
    the same as ``fingerprint(render(body))``, computed without building the rendering."""
    if "messages" in body:
        return _stream_fingerprint(_chat_pieces(body), tokens_per_byte, block_bytes)
    data = render_completion(body)
    return fingerprint(data, tokens_per_byte, block_bytes), len(data)


def from_blocks(blocks: Iterable[tuple[int, int]]) -> Fingerprint:
    """A fingerprint from blocks that are already ``(chained key, tokens)`` (the simulator's)."""
    return tuple((int(k), int(n)) for k, n in blocks)


def total_tokens(fp: Fingerprint) -> int:
    return sum(map(_TOKENS, fp))  # map, not a generator: this runs for every request


_TOKENS = itemgetter(1)


def held_blocks(fp: Fingerprint, held: Container[int]) -> int:
    """How many leading blocks of ``fp`` are in ``held``, for a ``held`` that keeps whole prefixes (the keys
    are chained: a block held means every block before it is): a binary search."""
    lo, hi = 0, len(fp)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fp[mid - 1][0] in held:
            lo = mid
        else:
            hi = mid - 1
    return lo


__all__ = [
    "BLOCK_BYTES",
    "fingerprint",
    "from_blocks",
    "held_blocks",
    "render",
    "render_chat",
    "render_completion",
    "request_fingerprint",
    "total_tokens",
]

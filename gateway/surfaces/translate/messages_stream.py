"""Chat completion SSE payloads → Anthropic's Messages streaming protocol.

``MessagesStream`` is fed parsed chat chunks (dicts) and returns encoded SSE events. One content
block at a time, in upstream order: reasoning deltas → a ``thinking`` block (``thinking_delta``s,
then a ``signature_delta`` before its stop), content deltas → a ``text`` block (``text_delta``),
each chat tool-call index → a ``tool_use`` block (id kept intact) whose argument fragments are
relayed as ``input_json_delta.partial_json`` exactly as they arrive (none dropped, none merged
across calls). A fragment that arrives late for a tool call whose block is already stopped (no
SGLang parser does this) is still sent, as a delta on that block's index, which the SDKs' by-index
accumulators apply: losing arguments is what makes Claude Code loop.

``start()`` gives ``message_start`` and may be sent before the first upstream chunk (usage then
carries the gateway's input estimate; the true counts come in ``message_delta``). ``finish()``
stops the open block and sends ``message_delta`` (stop_reason, usage) and ``message_stop``;
``fail()`` ends a broken stream with an ``error`` event. ``ping()`` is for the gateway to send
while a request waits or prefills.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.surfaces.translate.common import chunk_parts, parse_arguments, read_upstream_error, sse_event
from gateway.surfaces.translate.messages import MessagesRequest, error_type, signature, stop_reason, usage_of


@dataclass(slots=True)
class _Block:
    kind: str  # "thinking" | "text" | "tool_use"
    index: int
    text: str = ""
    call_id: str = ""
    name: str = ""
    open: bool = True


class MessagesStream:
    """One streamed Messages answer, built from the upstream's chat chunks (see the module doc)."""

    def __init__(self, req: MessagesRequest, message_id: str, input_tokens: int = 0) -> None:
        self.req = req
        self.message_id = message_id
        self.input_tokens = input_tokens
        self.blocks: list[_Block] = []
        self.calls: dict[int, _Block] = {}  # chat tool-call index -> its block
        self._pending: dict[int, dict[str, str]] = {}  # fragments seen before the call's name
        self._current: _Block | None = None
        self.finish_reason: str | None = None
        self.matched_stop: Any = None
        self.usage: dict[str, Any] | None = None
        self._started = False
        self.done = False

    @property
    def saw_finish(self) -> bool:
        """Whether the upstream said it was done (a ``finish_reason``): else its end is a break."""
        return self.finish_reason is not None

    def start(self) -> bytes:
        """``message_start`` (once; later calls return nothing)."""
        if self._started:
            return b""
        self._started = True
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.req.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": self.input_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 0,
            },
        }
        return sse_event("message_start", {"type": "message_start", "message": message})

    @staticmethod
    def ping() -> bytes:
        return sse_event("ping", {"type": "ping"})

    def feed(self, payload: Any) -> bytes:
        """Events for one parsed upstream chunk (an ``{"error": …}`` payload fails the stream)."""
        if self.done or not isinstance(payload, dict):
            return b""
        out = [self.start()]
        if "error" in payload and not payload.get("choices"):
            err = read_upstream_error(502, payload)
            return b"".join(out) + self.fail(err.message, err.status)
        if isinstance(payload.get("usage"), dict):
            self.usage = payload["usage"]
        for kind, value in chunk_parts(payload):
            if kind == "tool":
                out.append(self._tool(value))
            elif kind == "finish":
                self.finish_reason = str(value["finish_reason"])
                self.matched_stop = value.get("matched_stop")
            else:
                out.append(self._text(kind, value))
        return b"".join(out)

    def _delta(self, block: _Block, delta: dict[str, Any]) -> bytes:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": block.index, "delta": delta})

    def _open(self, kind: str, **fields: Any) -> tuple[_Block, bytes]:
        closing = self._close()
        block = _Block(kind, len(self.blocks), **fields)
        self.blocks.append(block)
        self._current = block
        if kind == "thinking":
            body: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
        elif kind == "text":
            body = {"type": "text", "text": ""}
        else:
            body = {"type": "tool_use", "id": block.call_id, "name": block.name, "input": {}}
        return block, closing + sse_event(
            "content_block_start", {"type": "content_block_start", "index": block.index, "content_block": body}
        )

    def _close(self) -> bytes:
        block, self._current = self._current, None
        if block is None or not block.open:
            return b""
        block.open = False
        out = b""
        if block.kind == "thinking":
            out = self._delta(block, {"type": "signature_delta", "signature": signature(block.text)})
        return out + sse_event("content_block_stop", {"type": "content_block_stop", "index": block.index})

    def _text(self, kind: str, text: str) -> bytes:
        out = b""
        block = self._current
        if block is None or block.kind != kind:
            block, out = self._open(kind)
        block.text += text
        field = "thinking" if kind == "thinking" else "text"
        return out + self._delta(block, {"type": f"{field}_delta", field: text})

    def _tool(self, call: dict[str, Any]) -> bytes:
        index = call.get("index", 0)
        index = index if isinstance(index, int) else 0
        fn = call.get("function") or {}
        arguments = fn.get("arguments")
        fragment: str = arguments if isinstance(arguments, str) else ""
        out = b""
        block = self.calls.get(index)
        if block is None:
            pending = self._pending.setdefault(index, {"id": "", "args": ""})
            if isinstance(call.get("id"), str) and call["id"]:
                pending["id"] = call["id"]
            name = fn.get("name")
            if not isinstance(name, str) or not name:
                pending["args"] += fragment
                return b""
            del self._pending[index]
            block, out = self._open("tool_use", call_id=pending["id"] or f"toolu_{index}", name=name)
            self.calls[index] = block
            fragment = pending["args"] + fragment
        if fragment:
            block.text += fragment
            out += self._delta(block, {"type": "input_json_delta", "partial_json": fragment})
        return out

    def finish(self) -> bytes:
        """Stop the open block; ``message_delta`` (stop_reason, usage) and ``message_stop``. Idempotent."""
        if self.done:
            return b""
        out = [self.start()]
        for index in sorted(self._pending):  # a call whose name never came: still deliver its arguments
            out.append(self._tool({"index": index, "function": {"name": "unknown", "arguments": ""}}))
        out.append(self._close())
        self.done = True
        reason, sequence = stop_reason(
            self.finish_reason or "stop", self.matched_stop, self.req.stop_sequences, bool(self.calls)
        )
        usage = usage_of(self.usage) if self.usage else {"input_tokens": self.input_tokens, "output_tokens": 0}
        out.append(
            sse_event(
                "message_delta",
                {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage},
            )
        )
        out.append(sse_event("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    def fail(self, message: str, status: int = 502, code: str | None = None) -> bytes:
        """End a broken stream with one ``error`` event (Anthropic's in-stream error shape)."""
        if self.done:
            return b""
        self.done = True
        return sse_event("error", {"type": "error", "error": {"type": error_type(status, code), "message": message}})

    @property
    def message(self) -> dict[str, Any]:
        """The message as streamed so far (tool inputs parsed), for logs and the stored record."""
        content: list[dict[str, Any]] = []
        for block in self.blocks:
            if block.kind == "thinking":
                content.append({"type": "thinking", "thinking": block.text, "signature": signature(block.text)})
            elif block.kind == "text":
                content.append({"type": "text", "text": block.text})
            else:
                content.append(
                    {"type": "tool_use", "id": block.call_id, "name": block.name, "input": parse_arguments(block.text)}
                )
        reason, sequence = stop_reason(self.finish_reason, self.matched_stop, self.req.stop_sequences, bool(self.calls))
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.req.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage_of(self.usage) if self.usage else {"input_tokens": self.input_tokens, "output_tokens": 0},
        }

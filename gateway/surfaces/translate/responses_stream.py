"""Chat completion SSE payloads → the OpenAI Responses streaming protocol.

``ResponsesStream`` is fed parsed chat chunks (dicts) and returns encoded SSE events
(``event: NAME\\ndata: JSON\\n\\n``), each with its ``sequence_number`` and the ``output_index`` /
``item_id`` / ``content_index`` the SDK's event types require. Item order follows the upstream:

- reasoning deltas → a ``reasoning`` item: ``response.reasoning_text.delta`` (content part 0), or
  ``response.reasoning_summary_text.delta`` when the request asked for ``reasoning.summary``;
- content deltas → a ``message`` item with one ``output_text`` part: ``response.output_text.delta``;
- tool-call deltas → one ``function_call`` item per chat tool-call index, ``call_id`` = the chat id
  kept intact, ``response.function_call_arguments.delta`` per fragment (a custom tool's call is a
  ``custom_tool_call`` item whose input, a string inside the model's JSON, is sent whole at its
  end). Function-call items stay open until the tool phase ends (another kind of output, or the
  finish), so a fragment that arrives late for an earlier call is still delivered and counted in
  that item's ``.done``.

``start()`` gives ``response.created`` + ``response.in_progress`` and may be sent before the first
upstream chunk. ``finish()`` closes every open item and ends with ``response.completed`` (or
``response.incomplete`` on ``finish_reason: length``); ``fail()`` ends a broken stream with an
``error`` event and ``response.failed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.surfaces.translate.common import chunk_parts, new_id, read_upstream_error, sse_event
from gateway.surfaces.translate.responses import (
    ResponsesRequest,
    custom_call_item,
    function_call_item,
    incomplete_reason,
    message_item,
    reasoning_item,
    response_object,
    response_usage,
)
from gateway.surfaces.translate.responses_tools import custom_input

_ITEM_KIND = {"thinking": "reasoning", "text": "message"}  # a chunk part -> the output item it extends


@dataclass(slots=True)
class _Item:
    kind: str  # "reasoning" | "message" | "function_call" | "custom_tool_call"
    item_id: str
    output_index: int
    text: str = ""
    call_id: str = ""
    name: str = ""
    open: bool = True


class ResponsesStream:
    """One streamed Responses answer, built from the upstream's chat chunks (see the module doc)."""

    def __init__(self, req: ResponsesRequest, response_id: str, created_at: float) -> None:
        self.req = req
        self.response_id = response_id
        self.created_at = created_at
        self.items: list[_Item] = []
        self.calls: dict[int, _Item] = {}  # chat tool-call index -> its item
        self._pending_args: dict[int, str] = {}  # arguments seen before the call's name
        self._current: _Item | None = None  # the open reasoning or message item
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.response: dict[str, Any] | None = None  # the final Response, once finished or failed
        self._seq = 0
        self._started = False

    @property
    def finished(self) -> bool:
        return self.response is not None

    @property
    def saw_finish(self) -> bool:
        """Whether the upstream said it was done (a ``finish_reason``): else its end is a break."""
        return self.finish_reason is not None

    def _event(self, name: str, **fields: Any) -> bytes:
        data = {"type": name, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse_event(name, data)

    def start(self) -> bytes:
        """``response.created`` and ``response.in_progress`` (once; later calls return nothing)."""
        if self._started:
            return b""
        self._started = True
        snapshot = response_object(self.req, self.response_id, self.created_at, "in_progress", [])
        return self._event("response.created", response=snapshot) + self._event(
            "response.in_progress", response=snapshot
        )

    def feed(self, payload: Any) -> bytes:
        """Events for one parsed upstream chunk (an ``{"error": …}`` payload fails the stream)."""
        if self.finished or not isinstance(payload, dict):
            return b""
        out = [self.start()]
        if "error" in payload and not payload.get("choices"):
            err = read_upstream_error(502, payload)
            return b"".join(out) + self.fail(err.message, err.code or "server_error")
        if isinstance(payload.get("usage"), dict):
            self.usage = payload["usage"]
        for kind, value in chunk_parts(payload):
            if kind == "tool":
                out.append(self._tool(value))
            elif kind == "finish":
                self.finish_reason = str(value["finish_reason"])
            else:
                out.append(self._text(_ITEM_KIND[kind], value))
        return b"".join(out)

    def _add(self, kind: str, **fields: Any) -> _Item:
        prefix = {"reasoning": "rs_", "message": "msg_", "function_call": "fc_", "custom_tool_call": "ctc_"}[kind]
        item = _Item(kind, new_id(prefix), len(self.items), **fields)
        self.items.append(item)
        return item

    def _text(self, kind: str, text: str) -> bytes:
        out: list[bytes] = []
        item = self._current
        if item is None or item.kind != kind:
            out.append(self._begin(kind))
            item = self._current
            assert item is not None
        item.text += text
        ids = {"item_id": item.item_id, "output_index": item.output_index}
        if kind == "message":
            out.append(self._event("response.output_text.delta", **ids, content_index=0, delta=text, logprobs=[]))
        elif self.req.wants_summary:
            out.append(self._event("response.reasoning_summary_text.delta", **ids, summary_index=0, delta=text))
        else:
            out.append(self._event("response.reasoning_text.delta", **ids, content_index=0, delta=text))
        return b"".join(out)

    def _begin(self, kind: str) -> bytes:
        """Open a reasoning or message item and its one part."""
        out = [self._close_open()]
        item = self._current = self._add(kind)
        out.append(
            self._event(
                "response.output_item.added",
                output_index=item.output_index,
                item=self._item_body(item, "in_progress", empty=True),
            )
        )
        ids = {"item_id": item.item_id, "output_index": item.output_index}
        if kind == "message":
            out.append(
                self._event(
                    "response.content_part.added",
                    **ids,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []},
                )
            )
        elif self.req.wants_summary:
            out.append(
                self._event(
                    "response.reasoning_summary_part.added",
                    **ids,
                    summary_index=0,
                    part={"type": "summary_text", "text": ""},
                )
            )
        else:
            out.append(
                self._event(
                    "response.content_part.added", **ids, content_index=0, part={"type": "reasoning_text", "text": ""}
                )
            )
        return b"".join(out)

    def _tool(self, call: dict[str, Any]) -> bytes:
        index = call.get("index", 0)
        index = index if isinstance(index, int) else 0
        fn = call.get("function") or {}
        arguments = fn.get("arguments")
        fragment: str = arguments if isinstance(arguments, str) else ""
        out: list[bytes] = []
        item = self.calls.get(index)
        if item is None:
            name = fn.get("name")
            if not isinstance(name, str) or not name:
                self._pending_args[index] = self._pending_args.get(index, "") + fragment
                return b""
            if self._current is not None:
                out.append(self._close_open())
            call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else new_id("call_")
            kind = "custom_tool_call" if name in self.req.custom_tools else "function_call"
            item = self.calls[index] = self._add(kind, call_id=call_id, name=name)
            out.append(
                self._event(
                    "response.output_item.added",
                    output_index=item.output_index,
                    item=self._item_body(item, "in_progress", empty=True),
                )
            )
            fragment = self._pending_args.pop(index, "") + fragment
        if fragment:
            item.text += fragment
            if item.kind == "custom_tool_call":  # its input is a string inside the JSON: sent whole at the end
                return b"".join(out)
            out.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item.item_id,
                    output_index=item.output_index,
                    delta=fragment,
                )
            )
        return b"".join(out)

    def _status(self) -> str:
        return "incomplete" if incomplete_reason(self.finish_reason) else "completed"

    def _item_body(self, item: _Item, status: str, empty: bool = False) -> dict[str, Any]:
        text = "" if empty else item.text
        if item.kind == "reasoning":
            body = reasoning_item(item.item_id, text, self.req.wants_summary, status)
            if empty:
                body["content"] = []
                body["summary"] = []
                body["encrypted_content"] = None
            return body
        if item.kind == "message":
            body = message_item(item.item_id, text, status)
            if empty:
                body["content"] = []
            return body
        if item.kind == "custom_tool_call":
            return custom_call_item(item.item_id, item.call_id, item.name, custom_input(text) if text else "")
        return function_call_item(item.item_id, item.call_id, item.name, text, status)

    def _close(self, item: _Item) -> bytes:
        if not item.open:
            return b""
        item.open = False
        status = self._status()
        ids = {"item_id": item.item_id, "output_index": item.output_index}
        out: list[bytes] = []
        if item.kind == "message":
            out.append(self._event("response.output_text.done", **ids, content_index=0, text=item.text, logprobs=[]))
            out.append(
                self._event(
                    "response.content_part.done",
                    **ids,
                    content_index=0,
                    part={"type": "output_text", "text": item.text, "annotations": []},
                )
            )
        elif item.kind == "reasoning" and self.req.wants_summary:
            out.append(self._event("response.reasoning_summary_text.done", **ids, summary_index=0, text=item.text))
            out.append(
                self._event(
                    "response.reasoning_summary_part.done",
                    **ids,
                    summary_index=0,
                    part={"type": "summary_text", "text": item.text},
                )
            )
        elif item.kind == "reasoning":
            out.append(self._event("response.reasoning_text.done", **ids, content_index=0, text=item.text))
            out.append(
                self._event(
                    "response.content_part.done",
                    **ids,
                    content_index=0,
                    part={"type": "reasoning_text", "text": item.text},
                )
            )
        elif item.kind == "custom_tool_call":
            text = custom_input(item.text) if item.text else ""
            if text:
                out.append(self._event("response.custom_tool_call_input.delta", **ids, delta=text))
            out.append(self._event("response.custom_tool_call_input.done", **ids, input=text))
        else:
            out.append(self._event("response.function_call_arguments.done", **ids, arguments=item.text))
        out.append(
            self._event("response.output_item.done", output_index=item.output_index, item=self._item_body(item, status))
        )
        return b"".join(out)

    def _close_open(self) -> bytes:
        """Close the open reasoning/message item and every open function call, in output order."""
        self._current = None
        return b"".join(self._close(item) for item in self.items if item.open)

    def _final(self, status: str, reason: str | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
        output = [self._item_body(item, "incomplete" if status != "completed" else "completed") for item in self.items]
        self.response = response_object(
            self.req, self.response_id, self.created_at, status, output, response_usage(self.usage), reason, error
        )
        return self.response

    def finish(self) -> bytes:
        """Close open items; ``response.completed`` (or ``response.incomplete``). Idempotent."""
        if self.finished:
            return b""
        out = [self.start()]
        for index, pending in sorted(self._pending_args.items()):  # a call whose name never came
            if pending:
                out.append(self._tool({"index": index, "function": {"name": "unknown", "arguments": ""}}))
        if not self.items:  # an empty answer is still one (empty) message, as the API gives
            out.append(self._begin("message"))
        out.append(self._close_open())
        reason = incomplete_reason(self.finish_reason)
        status = "incomplete" if reason else "completed"
        response = self._final(status, reason)
        out.append(self._event(f"response.{status}", response=response))
        return b"".join(out)

    def fail(self, message: str, code: str = "server_error") -> bytes:
        """End a broken stream: an ``error`` event, then ``response.failed`` with what was produced."""
        if self.finished:
            return b""
        out = [self.start()]
        for item in self.items:
            item.open = False
        response = self._final("failed", error={"code": _failed_code(code), "message": message})
        out.append(self._event("error", code=code, message=message, param=None))
        out.append(self._event("response.failed", response=response))
        return b"".join(out)

    @property
    def output(self) -> list[dict[str, Any]]:
        """The output items so far (the final ones once finished), for the response store."""
        if self.response is not None:
            return list(self.response["output"])
        return [self._item_body(item, "in_progress") for item in self.items]


# ``response.error.code`` is a closed set in the SDK's types; anything else is a server error.
_FAILED_CODES = {"server_error", "rate_limit_exceeded", "invalid_prompt"}


def _failed_code(code: str) -> str:
    return code if code in _FAILED_CODES else "server_error"


def keepalive() -> bytes:
    """An SSE comment: keeps idle timers from firing while a request waits (every Responses client
    ignores comments)."""
    return b": keepalive\n\n"

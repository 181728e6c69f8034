"""A deterministic Kimi-style chat template for the simulated SGLang server.

The rendering is append-only: the prompt of turn N+1 (which resends turn N's answer as an
assistant message) starts, byte for byte, with the prompt of turn N followed by the text the
twin generated for it (:func:`assistant_text`). That is what makes a resent conversation hit
the twin's prefix cache for prompt + answer, as it would on a real engine.

Rules:
- tools come first as one system block ``tool_declare`` (JSON, sorted keys);
- every message is ``<|im_{role}|>{name}<|im_middle|>{body}<|im_end|>``;
- an assistant message's body is its content followed by its tool calls in Kimi's markup;
  reasoning from earlier turns is dropped, as Kimi's own template drops it;
- the generation prompt is the assistant header, so the answer continues the prompt directly.
"""

from __future__ import annotations

import json
from typing import Any

END = "<|im_end|>"
ASSISTANT_HEADER = "<|im_assistant|>assistant<|im_middle|>"


class TemplateError(ValueError):
    """A message the template cannot render (answered with SGLang's 400)."""


def content_text(content: Any) -> str:
    """Text of an OpenAI message ``content``: a string, a list of parts, or None."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict):
                # Images and other parts: a fixed marker keeps the prefix deterministic.
                parts.append(f"<|media:{part.get('type', 'unknown')}|>")
            else:
                raise TemplateError("Invalid content part")
        return "".join(parts)
    raise TemplateError("Invalid message content")


def tool_calls_text(tool_calls: list[dict[str, Any]]) -> str:
    """Kimi K2's tool-call markup for a list of OpenAI ``tool_calls``."""
    if not tool_calls:
        return ""
    out = ["<|tool_calls_section_begin|>"]
    for call in tool_calls:
        fn = call.get("function") or {}
        args = fn.get("arguments", "")
        if not isinstance(args, str):
            args = json.dumps(args, sort_keys=True)
        out.append(f"<|tool_call_begin|>{call.get('id', '')}<|tool_call_argument_begin|>{args}<|tool_call_end|>")
    out.append("<|tool_calls_section_end|>")
    return "".join(out)


def assistant_text(content: str, tool_calls: list[dict[str, Any]] | None = None) -> str:
    """What the twin "generates" for an answer: exactly the body the next turn renders for it."""
    return content + tool_calls_text(tool_calls or [])


def render_message(message: dict[str, Any]) -> str:
    if not isinstance(message, dict) or "role" not in message:
        raise TemplateError("Each message needs a role")
    role = str(message["role"])
    if role == "assistant":
        return ASSISTANT_HEADER + assistant_text(content_text(message.get("content")), message.get("tool_calls")) + END
    if role == "tool":
        name = str(message.get("tool_call_id") or message.get("name") or "tool")
        return f"<|im_system|>{name}<|im_middle|>{content_text(message.get('content'))}{END}"
    if role in ("system", "developer"):
        return f"<|im_system|>system<|im_middle|>{content_text(message.get('content'))}{END}"
    if role == "user":
        return f"<|im_user|>user<|im_middle|>{content_text(message.get('content'))}{END}"
    raise TemplateError(f"Unsupported message role: {role}")


def render_chat(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *, add_generation_prompt: bool = True
) -> str:
    """The prompt text for a chat request."""
    parts: list[str] = []
    if tools:
        parts.append(f"<|im_system|>tool_declare<|im_middle|>{json.dumps(tools, sort_keys=True)}{END}")
    parts.extend(render_message(m) for m in messages)
    last = messages[-1] if messages else None
    # Continuing a trailing assistant message (prefill) renders it open, without the end marker.
    if last is not None and last.get("role") == "assistant" and add_generation_prompt is False:
        parts[-1] = parts[-1][: -len(END)]
    elif add_generation_prompt:
        parts.append(ASSISTANT_HEADER)
    return "".join(parts)

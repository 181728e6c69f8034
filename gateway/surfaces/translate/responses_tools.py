"""Responses tools on a chat backend: function tools, and custom (freeform) tools as functions.

A chat backend knows only function tools. A Responses ``function`` tool is flattened the other
way; a ``custom`` tool (free text in, e.g. Codex's ``apply_patch`` when its model family uses the
freeform variant) becomes a function with one string parameter ``input`` whose description carries
the tool's grammar, and the model's calls of it come back as ``custom_tool_call`` items carrying
that string. Hosted tools (web search, file search, …) have nothing behind a chat backend to run
them and are dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.surfaces.translate.common import bad


@dataclass(slots=True)
class Tools:
    echo: list[dict[str, Any]]  # the accepted tools in Responses shape (a Response repeats them)
    chat: list[dict[str, Any]]  # the same as chat function tools
    custom: frozenset[str]  # names of the custom (freeform) tools


def read_tools(value: Any) -> Tools:
    if value is None:
        return Tools([], [], frozenset())
    if not isinstance(value, list):
        raise bad("'tools' must be an array.", "tools")
    echo: list[dict[str, Any]] = []
    chat: list[dict[str, Any]] = []
    custom: set[str] = set()
    for i, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise bad(f"'tools[{i}]' must be an object.", f"tools[{i}]")
        kind = tool.get("type")
        if kind not in ("function", "custom"):
            continue  # hosted tools: nothing behind a chat backend can run them
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise bad(f"'tools[{i}].name' is required.", f"tools[{i}].name")
        keys = (
            ("type", "name", "description", "parameters", "strict")
            if kind == "function"
            else ("type", "name", "description", "format")
        )
        flat = {k: tool[k] for k in keys if tool.get(k) is not None}
        echo.append(flat)
        if kind == "function":
            chat.append({"type": "function", "function": {k: v for k, v in flat.items() if k != "type"}})
        else:
            custom.add(name)
            chat.append(
                {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": flat.get("description", ""),
                        "parameters": _custom_parameters(flat),
                    },
                }
            )
    return Tools(echo, chat, frozenset(custom))


def _custom_parameters(tool: dict[str, Any]) -> dict[str, Any]:
    fmt = tool.get("format")
    hint = "The tool's whole input, as free text."
    if isinstance(fmt, dict) and fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        hint = (
            f"The tool's whole input, as free text matching this {fmt.get('syntax', 'lark')} grammar:\n"
            + fmt["definition"]
        )
    return {"type": "object", "properties": {"input": {"type": "string", "description": hint}}, "required": ["input"]}


def chat_tool_choice(value: Any) -> Any:
    """A Responses ``tool_choice`` as chat's (hosted-tool choices become ``auto``)."""
    if value is None or value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict):
        if value.get("type") in ("function", "custom") and isinstance(value.get("name"), str):
            return {"type": "function", "function": {"name": value["name"]}}
        if value.get("type") == "allowed_tools":
            return "required" if value.get("mode") == "required" else "auto"
        return "auto"
    raise bad("'tool_choice' must be auto, none, required or a tool.", "tool_choice")


def custom_arguments(text: str) -> str:
    """A custom tool call's input as the chat arguments the model would have written."""
    return json.dumps({"input": text}, ensure_ascii=False)


def custom_input(arguments: str) -> str:
    """The model's chat arguments for a custom tool → its free-text input (the raw arguments when
    they are not ``{"input": "..."}``, so nothing is lost)."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return str(value["input"])
    return arguments

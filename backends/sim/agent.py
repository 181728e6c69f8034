"""The twin as an agent's counterpart: which offered tool it calls, and with what arguments.

Rules (deterministic, no magic words):
- A request that offers tools and ends with a fresh user turn (its last message is the user's, not
  a tool result) is answered with one call to one offered tool; a request whose last message is a
  tool result is answered with text (``finish_reason: stop``). ``tool_choice: "none"`` means text;
  ``"required"`` or a named function forces a call (the named one).
- The tool: the first offered tool whose name reads as read-only (``read``, ``view``, ``list``,
  ``ls``, ``glob``, ``grep``, ``search``, ``find``, ``get``, ``cat``, ``show``, in that order of
  preference), skipping names that write, execute or leave the machine (``write``, ``edit``,
  ``web``, ``image``, ``mcp``...); else a shell-like tool (asked to run ``ls``); else the first tool.
- Its arguments: every *required* property of the tool's JSON schema, filled with a plausible
  value that validates: a path-like string is ``README.md`` (absolute, under the working directory
  the client's prompt names, when the schema asks for an absolute path); a directory is that
  working directory (or ``.``); a pattern ``*.md``; a query ``README``; a command ``ls``; an enum
  its first value; a ``default`` or ``const`` as given; numbers their minimum (or 1); booleans
  false; arrays one item; objects their own required properties.
"""

from __future__ import annotations

import json
import re
from typing import Any

READ_ONLY = ("read", "view", "list", "ls", "glob", "grep", "search", "find", "get", "cat", "show")
"""Name words of read-only tools, in order of preference."""
AVOID = (
    "write", "edit", "delete", "remove", "create", "update", "patch", "apply", "exec", "run", "kill",
    "todo", "task", "agent", "plan", "web", "fetch", "url", "http", "image", "mcp", "notebook", "exit",
    "memory", "ask",
)  # fmt: skip
"""Name words that disqualify a tool from the read-only preference."""
SHELL = ("shell", "bash", "command", "terminal", "exec")
SAMPLE_FILE = "README.md"

_CWD_PATTERNS = (
    re.compile(r"<cwd>\s*([^<\n]+?)\s*</cwd>"),
    re.compile(r"[Ww]orking directory:\s*(/[^\s\"'<]+)"),
    re.compile(r"\"cwd\"\s*:\s*\"(/[^\"]+)\""),
)


def tool_spec(tool: Any) -> tuple[str, dict[str, Any]] | None:
    """(name, JSON schema) of a tool in the chat, Responses or Anthropic shape; None if it has no name."""
    if not isinstance(tool, dict):
        return None
    inner = tool.get("function")
    fn: dict[str, Any] = inner if isinstance(inner, dict) else tool
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        return None
    schema = fn.get("parameters", fn.get("input_schema"))
    return name, schema if isinstance(schema, dict) else {}


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w for w in re.split(r"[^a-zA-Z0-9]+", spaced.lower()) if w]


def choose_tool(tools: list[Any], tool_choice: Any = "auto") -> tuple[str, dict[str, Any]] | None:
    """The tool the twin calls, or None (no usable tool, or ``tool_choice`` says none)."""
    if tool_choice == "none":
        return None
    specs = [s for s in (tool_spec(t) for t in tools or []) if s is not None]
    if not specs:
        return None
    forced = _forced_name(tool_choice)
    if forced is not None:
        return next((s for s in specs if s[0] == forced), None)
    for word in READ_ONLY:
        for name, schema in specs:
            words = _words(name)
            if word in words and not any(a in words for a in AVOID):
                return name, schema
    for name, schema in specs:
        if any(w in SHELL for w in _words(name)):
            return name, schema
    return specs[0]


def _forced_name(tool_choice: Any) -> str | None:
    if isinstance(tool_choice, dict):
        inner = tool_choice.get("function")
        fn: dict[str, Any] = inner if isinstance(inner, dict) else tool_choice
        name = fn.get("name")
        return name if isinstance(name, str) else None
    return None


def working_directory(prompt_text: str) -> str | None:
    """The working directory a coding client names in its prompt (Codex, Claude Code), if any."""
    for pattern in _CWD_PATTERNS:
        m = pattern.search(prompt_text)
        if m:
            return m.group(1).rstrip("/") or "/"
    return None


def arguments_for(schema: dict[str, Any], cwd: str | None = None) -> dict[str, Any]:
    """Values for the required properties of an object schema (see the module rules)."""
    value = _value("", _resolve(schema), cwd, depth=0)
    return value if isinstance(value, dict) else {}


def tool_call(name: str, schema: dict[str, Any], index: int, cwd: str | None) -> dict[str, Any]:
    """An OpenAI-shaped tool call with Kimi's id ``functions.NAME:INDEX``."""
    args = json.dumps(arguments_for(schema, cwd), ensure_ascii=False)
    return {"id": f"functions.{name}:{index}", "type": "function", "function": {"name": name, "arguments": args}}


def _resolve(schema: Any) -> dict[str, Any]:
    if not isinstance(schema, dict):
        return {}
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            non_null = [o for o in options if isinstance(o, dict) and o.get("type") != "null"]
            merged = {k: v for k, v in schema.items() if k != key}
            return {**merged, **_resolve((non_null or options)[0])}
    if isinstance(schema.get("allOf"), list):
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            merged.update(_resolve(part))
        return merged
    return schema


def _type(schema: dict[str, Any]) -> str:
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "string")
    if isinstance(t, str):
        return t
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return "string"


def _value(name: str, schema: dict[str, Any], cwd: str | None, depth: int) -> Any:
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if "default" in schema and schema["default"] is not None:
        return schema["default"]
    kind = _type(schema)
    if kind == "object":
        raw = schema.get("properties")
        props: dict[str, Any] = raw if isinstance(raw, dict) else {}
        required = [r for r in schema.get("required") or [] if isinstance(r, str)]
        if depth > 4:
            return {}
        return {r: _value(r, _resolve(props.get(r, {})), cwd, depth + 1) for r in required}
    if kind == "array":
        n = max(1, int(schema.get("minItems") or 0))
        item = _resolve(schema.get("items") or {"type": "string"})
        plain = _type(item) == "string" and not ({"enum", "const", "minLength", "pattern"} & item.keys())
        if _is_command(name) and plain:
            return ["ls"] + ["."] * (n - 1)
        return [_value(name, item, cwd, depth + 1) for _ in range(n)]
    if kind in ("integer", "number"):
        lo = schema.get("minimum", schema.get("exclusiveMinimum"))
        v = lo if isinstance(lo, int | float) and not isinstance(lo, bool) else 1
        if "exclusiveMinimum" in schema and v == schema["exclusiveMinimum"]:
            v += 1
        hi = schema.get("maximum")
        if isinstance(hi, int | float) and v > hi:
            v = hi
        return int(v) if kind == "integer" else float(v)
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return _string(name, schema, cwd)


def _is_command(name: str) -> bool:
    return any(w in ("command", "cmd", "commands", "argv") for w in _words(name))


def _string(name: str, schema: dict[str, Any], cwd: str | None) -> str:
    words = _words(name)
    desc = str(schema.get("description", "")).lower()
    if any(w in ("dir", "directory", "workdir", "cwd", "folder", "root") for w in words):
        s = cwd or "."
    elif any(w in ("path", "file", "filename", "filepath", "uri") for w in words) or "path" in desc:
        s = f"{cwd}/{SAMPLE_FILE}" if cwd and "absolute" in desc else SAMPLE_FILE
    elif any(w in ("pattern", "glob", "regex") for w in words):
        s = "*.md" if "glob" in words or "glob" in desc else "README"
    elif any(w in ("query", "search", "text", "q", "keyword") for w in words):
        s = "README"
    elif _is_command(name):
        s = "ls"
    elif any(w in ("url", "link") for w in words):
        s = "http://127.0.0.1/"
    else:
        s = "example"
    lo = schema.get("minLength")
    if isinstance(lo, int) and len(s) < lo:
        s = s + "x" * (lo - len(s))
    hi = schema.get("maxLength")
    if isinstance(hi, int) and len(s) > hi:
        s = s[:hi]
    return s

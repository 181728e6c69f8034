"""``backends/sim/agent.py``: the twin as an agent's counterpart, rule by rule: reading a tool in each
client shape, which offered tool it calls, the working directory a prompt names, and the value each kind of
required property gets. (Over HTTP, with real clients' tools: tests/backends/test_twin_agent.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from backends.sim.agent import arguments_for, choose_tool, tool_call, tool_spec, working_directory

SCHEMA = {"type": "object", "required": ["path"], "properties": {"path": {"type": "string"}}}


def named(*names: str) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": n, "parameters": {}}} for n in names]


def test_a_tool_is_read_in_the_chat_responses_and_anthropic_shapes() -> None:
    assert tool_spec({"type": "function", "function": {"name": "a", "parameters": SCHEMA}}) == ("a", SCHEMA)
    assert tool_spec({"type": "function", "name": "b", "parameters": SCHEMA}) == ("b", SCHEMA)  # Responses
    assert tool_spec({"name": "c", "input_schema": SCHEMA}) == ("c", SCHEMA)  # Anthropic
    assert tool_spec({"type": "function", "function": {"name": "d", "parameters": "not a schema"}}) == ("d", {})
    assert tool_spec({"type": "web_search"}) is None and tool_spec("read") is None
    assert tool_spec({"name": ""}) is None


def test_the_first_read_only_word_in_order_of_preference_wins() -> None:
    assert choose_tool(named("grep_files", "view_image", "ReadFile"))[0] == "ReadFile"  # type: ignore[index]
    assert choose_tool(named("list_dir", "grep"))[0] == "list_dir"  # type: ignore[index]
    # "read" among words that write or leave the machine disqualifies the tool
    assert choose_tool(named("read_and_write", "readMcpResource", "Glob"))[0] == "Glob"  # type: ignore[index]


def test_without_a_read_only_tool_a_shell_then_the_first_tool() -> None:
    shells = named("apply_patch", "run_terminal_cmd", "exec_command")
    assert choose_tool(shells)[0] == "run_terminal_cmd"  # type: ignore[index]  # the first shell-like one offered
    assert choose_tool(named("apply_patch", "update_plan"))[0] == "apply_patch"  # type: ignore[index]
    assert choose_tool([]) is None and choose_tool([{"type": "web_search"}]) is None


def test_tool_choice_none_and_a_named_tool() -> None:
    tools = named("Read", "Write")
    assert choose_tool(tools, "none") is None
    assert choose_tool(tools, {"type": "function", "function": {"name": "Write"}})[0] == "Write"  # type: ignore[index]
    assert choose_tool(tools, {"type": "function", "name": "Write"})[0] == "Write"  # type: ignore[index]
    assert choose_tool(tools, {"type": "tool", "name": "Edit"}) is None  # forced but not offered
    assert choose_tool(tools, "required")[0] == "Read"  # type: ignore[index]


@pytest.mark.parametrize(
    ("prompt", "cwd"),
    [
        ("<environment_context>\n  <cwd>/tmp/work/</cwd>\n</environment_context>", "/tmp/work"),
        ("Working directory: /home/me/proj\nIs git repo: yes", "/home/me/proj"),
        ('{"cwd": "/srv/app", "shell": "bash"}', "/srv/app"),
        ("<cwd>/</cwd>", "/"),
        ("no directory named here", None),
        ("working directory: relative/path", None),
    ],
)
def test_the_working_directory_a_client_names(prompt: str, cwd: str | None) -> None:
    assert working_directory(prompt) == cwd


def obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "required": list(props), "properties": props}


def test_strings_by_name_and_description() -> None:
    s = {"type": "string"}
    args = arguments_for(
        obj(
            workdir=s,
            file_path={"type": "string", "description": "The absolute path"},
            target=s,
            glob_pattern=s,
            regex=s,
            query=s,
            cmd=s,
            url=s,
            where={"type": "string", "description": "A path in the repo"},
        ),
        "/w",
    )
    assert args == {
        "workdir": "/w",
        "file_path": "/w/README.md",
        "target": "example",
        "glob_pattern": "*.md",
        "regex": "README",
        "query": "README",
        "cmd": "ls",
        "url": "http://127.0.0.1/",
        "where": "README.md",
    }
    assert arguments_for(obj(dir=s, file={"type": "string", "description": "absolute"})) == {
        "dir": ".",
        "file": "README.md",  # absolute asked, but no working directory known
    }
    bounded = obj(a={"type": "string", "minLength": 10}, b={"type": "string", "maxLength": 3})
    assert arguments_for(bounded) == {"a": "examplexxx", "b": "exa"}


def test_const_enum_default_numbers_booleans_and_null() -> None:
    schema = obj(
        c={"const": "fixed"},
        e={"type": "string", "enum": ["first", "second"]},
        d={"type": "integer", "default": 42},
        lo={"type": "integer", "minimum": 3, "maximum": 9},
        ex={"type": "integer", "exclusiveMinimum": 0},
        hi={"type": "number", "maximum": 0.5},
        f={"type": "number"},
        b={"type": "boolean"},
        n={"type": "null"},
        opt={"type": ["null", "integer"]},
    )
    assert arguments_for(schema) == {
        "c": "fixed",
        "e": "first",
        "d": 42,
        "lo": 3,
        "ex": 1,
        "hi": 0.5,
        "f": 1.0,
        "b": False,
        "n": None,
        "opt": 1,
    }


def test_arrays_objects_and_combinators() -> None:
    schema = obj(
        command={"type": "array", "items": {"type": "string"}, "minItems": 2},
        tags={"type": "array", "items": {"type": "string", "enum": ["x"]}},
        nested=obj(inner={"type": "boolean"}),
        either={"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 5}]},
        both={"allOf": [{"type": "integer"}, {"minimum": 7}]},
        one={"oneOf": [{"type": "string", "enum": ["only"]}]},
    )
    schema["properties"]["optional"] = {"type": "string"}  # not required: left out
    assert arguments_for(schema) == {
        "command": ["ls", "."],
        "tags": ["x"],
        "nested": {"inner": False},
        "either": 5,
        "both": 7,
        "one": "only",
    }


def test_deep_or_odd_schemas_still_give_an_object() -> None:
    deep: dict[str, Any] = {"type": "boolean"}
    for _ in range(8):
        deep = obj(x=deep)
    value = arguments_for(deep)
    depth = 0
    while value:
        value, depth = value["x"], depth + 1
    assert depth == 5  # nesting stops at a fixed depth
    assert arguments_for({"type": "string"}) == {} and arguments_for("nope") == {}  # type: ignore[arg-type]
    assert arguments_for({"properties": {"a": {}}, "required": ["a", 3]}) == {"a": "example"}


def test_a_call_has_kimis_id_and_json_arguments() -> None:
    call = tool_call("Read", obj(file_path={"type": "string", "default": "é.md"}), 3, None)
    assert call["id"] == "functions.Read:3" and call["type"] == "function"
    assert call["function"]["name"] == "Read"
    assert call["function"]["arguments"] == '{"file_path": "é.md"}'  # not ASCII-escaped
    assert json.loads(call["function"]["arguments"]) == {"file_path": "é.md"}

"""Responses tools on a chat backend (gateway/surfaces/translate/responses_tools.py): function tools
flattened, custom (freeform) tools as one-string functions, hosted tools dropped, ``tool_choice`` mapped,
and a custom tool's input carried through chat arguments and back."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.http.errors import GatewayError
from gateway.surfaces.translate.responses_tools import chat_tool_choice, custom_arguments, custom_input, read_tools
from tests.translate.responses_helpers import PATCH_TOOL, TOOL


def test_function_custom_and_hosted_tools() -> None:
    strict = {**TOOL, "name": "grep", "strict": True, "description": None}
    tools = read_tools([TOOL, {"type": "web_search_preview"}, PATCH_TOOL, {"type": "file_search"}, strict])
    assert tools.echo == [
        TOOL,
        PATCH_TOOL,
        {"type": "function", "name": "grep", "parameters": TOOL["parameters"], "strict": True},
    ]
    assert tools.custom == frozenset({"apply_patch"})
    assert tools.chat[0] == {
        "type": "function",
        "function": {"name": "read_file", "description": "Read a file", "parameters": TOOL["parameters"]},
    }
    assert tools.chat[2]["function"] == {"name": "grep", "parameters": TOOL["parameters"], "strict": True}
    patch = tools.chat[1]["function"]
    assert (patch["name"], patch["description"]) == ("apply_patch", "Edit files.")
    params = patch["parameters"]
    assert params["required"] == ["input"] and params["properties"]["input"]["type"] == "string"
    description = params["properties"]["input"]["description"]
    assert "lark grammar" in description and description.endswith('start: "*** Begin Patch" body')


def test_a_custom_tool_without_a_grammar_takes_free_text() -> None:
    tools = read_tools(
        [{"type": "custom", "name": "note"}, {"type": "custom", "name": "n2", "format": {"type": "text"}}]
    )
    for tool in tools.chat:
        fn = tool["function"]
        assert fn["description"] == ""
        assert fn["parameters"]["properties"]["input"]["description"] == "The tool's whole input, as free text."
    assert tools.echo == [
        {"type": "custom", "name": "note"},
        {"type": "custom", "name": "n2", "format": {"type": "text"}},
    ]


def test_no_tools() -> None:
    tools = read_tools(None)
    assert (tools.echo, tools.chat, tools.custom) == ([], [], frozenset())


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ({"type": "function"}, "tools"),
        (["read_file"], "tools[0]"),
        ([{"type": "function", "parameters": {}}], "tools[0].name"),
        ([TOOL, {"type": "custom", "name": ""}], "tools[1].name"),
    ],
)
def test_bad_tools_are_400_with_where(value: Any, param: str) -> None:
    with pytest.raises(GatewayError) as err:
        read_tools(value)
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize(
    ("choice", "chat"),
    [
        (None, None),
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ({"type": "function", "name": "read_file"}, {"type": "function", "function": {"name": "read_file"}}),
        ({"type": "custom", "name": "apply_patch"}, {"type": "function", "function": {"name": "apply_patch"}}),
        ({"type": "allowed_tools", "mode": "required", "tools": []}, "required"),
        ({"type": "allowed_tools", "mode": "auto", "tools": []}, "auto"),
        ({"type": "web_search_preview"}, "auto"),
        ({"type": "function"}, "auto"),  # no name: nothing to force
    ],
)
def test_tool_choice(choice: Any, chat: Any) -> None:
    assert chat_tool_choice(choice) == chat


@pytest.mark.parametrize("choice", ["any", 1, ["auto"]])
def test_a_tool_choice_of_no_known_shape_is_400(choice: Any) -> None:
    with pytest.raises(GatewayError) as err:
        chat_tool_choice(choice)
    assert err.value.param == "tool_choice"


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_custom_input_survives_the_chat_arguments(text: str) -> None:
    arguments = custom_arguments(text)
    assert json.loads(arguments) == {"input": text}
    assert custom_input(arguments) == text


@pytest.mark.parametrize(
    "arguments",
    ["*** Begin Patch\n(the model wrote the input bare)", '{"input": 3}', '{"patch": "x"}', "[1, 2]", ""],
)
def test_arguments_that_are_not_an_input_object_are_kept_whole(arguments: str) -> None:
    assert custom_input(arguments) == arguments


def test_custom_arguments_keep_non_ascii_as_written() -> None:
    assert custom_arguments("é") == '{"input": "é"}'
    assert orjson.loads(custom_arguments('a "quoted"\nline')) == {"input": 'a "quoted"\nline'}

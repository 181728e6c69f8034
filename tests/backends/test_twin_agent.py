"""The twin as an agent's counterpart: tool choice and schema-valid arguments, a text answer after
the tool result, answer lengths from the workload's distribution, and Kimi's context window."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.sim.agent import arguments_for, choose_tool, working_directory
from backends.sim.planner import ANSWER_TOKENS
from backends.sim.testing import run_twin


def fn(name: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": params}}


READ = fn(
    "Read",
    {
        "type": "object",
        "required": ["file_path"],
        "properties": {
            "file_path": {"type": "string", "description": "The absolute path to the file to read"},
            "limit": {"type": "number"},
        },
    },
)
WRITE = fn(
    "Write",
    {
        "type": "object",
        "required": ["file_path", "content"],
        "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
    },
)
BASH = fn("Bash", {"type": "object", "required": ["command"], "properties": {"command": {"type": "string"}}})
SHELL = fn(
    "shell",
    {
        "type": "object",
        "required": ["command"],
        "properties": {"command": {"type": "array", "items": {"type": "string"}}, "workdir": {"type": "string"}},
    },
)
PATCH = fn("apply_patch", {"type": "object", "required": ["input"], "properties": {"input": {"type": "string"}}})


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with run_twin("tiny", time_scale=0.02, abort_delay_s=0.3, stream_interval_s=0.01) as u:
        yield u


def test_prefers_a_read_only_tool_by_name() -> None:
    assert choose_tool([WRITE, BASH, READ])[0] == "Read"  # type: ignore[index]
    assert choose_tool([PATCH, SHELL])[0] == "shell"  # type: ignore[index]
    web = fn("WebFetch", {"type": "object", "properties": {}})
    grep = fn("grep_files", {"type": "object", "properties": {}})
    assert choose_tool([web, grep])[0] == "grep_files"  # type: ignore[index]
    assert choose_tool([WRITE], "none") is None
    assert choose_tool([READ, WRITE], {"type": "function", "function": {"name": "Write"}})[0] == "Write"  # type: ignore[index]


def test_arguments_are_plausible_and_valid() -> None:
    cwd = working_directory("<environment_context>\n  <cwd>/tmp/work</cwd>\n</environment_context>")
    assert cwd == "/tmp/work"
    assert working_directory("Here is useful information:\nWorking directory: /home/me/proj\n") == "/home/me/proj"
    assert arguments_for(READ["function"]["parameters"], cwd) == {"file_path": "/tmp/work/README.md"}
    assert arguments_for(SHELL["function"]["parameters"], cwd) == {"command": ["ls"]}
    enum = {
        "type": "object",
        "required": ["mode", "n", "deep"],
        "properties": {
            "mode": {"enum": ["fast", "slow"]},
            "n": {"type": "integer", "minimum": 3},
            "deep": {"type": "boolean"},
        },
    }
    assert arguments_for(enum) == {"mode": "fast", "n": 3, "deep": False}


json_schemas = st.recursive(
    st.sampled_from(
        [
            {"type": "string"},
            {"type": "integer", "minimum": 2},
            {"type": "boolean"},
            {"type": "string", "enum": ["a", "b"]},
            {"type": "number"},
            {"type": "string", "minLength": 12},
            {"type": ["string", "null"]},
            {"anyOf": [{"type": "null"}, {"type": "integer"}]},
        ]
    ),
    lambda inner: st.one_of(
        st.builds(lambda items, n: {"type": "array", "items": items, "minItems": n}, inner, st.integers(0, 3)),
        st.dictionaries(
            st.sampled_from(["path", "file_path", "pattern", "query", "command", "dir", "x", "limit"]),
            inner,
            min_size=1,
            max_size=4,
        ).map(lambda props: {"type": "object", "properties": props, "required": sorted(props)}),
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["path", "pattern", "command", "q", "opts"]), json_schemas, max_size=4))
def test_arguments_validate_against_any_schema(props: dict[str, Any]) -> None:
    schema = {"type": "object", "properties": props, "required": sorted(props)}
    jsonschema.validate(arguments_for(schema, "/w"), schema)


def chat(url: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": "kimi", **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_a_fresh_turn_gets_a_call_and_the_tool_result_gets_text(url: str) -> None:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "Working directory: /srv/app"},
        {"role": "user", "content": "What is in this project?"},
    ]
    first = chat(url, {"messages": msgs, "tools": [WRITE, BASH, READ]})["choices"][0]
    assert first["finish_reason"] == "tool_calls"
    call = first["message"]["tool_calls"][0]
    assert call["id"] == "functions.Read:0" and call["function"]["name"] == "Read"
    assert json.loads(call["function"]["arguments"]) == {"file_path": "/srv/app/README.md"}
    msgs += [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "# app\nA web app."},
    ]
    second = chat(url, {"messages": msgs, "tools": [WRITE, BASH, READ]})
    assert second["choices"][0]["finish_reason"] == "stop" and second["choices"][0]["message"]["content"]
    assert not second["choices"][0]["message"].get("tool_calls")
    # A new question after the answer: a new call, numbered after the first.
    msgs += [
        {"role": "assistant", "content": second["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And the tests?"},
    ]
    third = chat(url, {"messages": msgs, "tools": [READ]})["choices"][0]
    assert third["message"]["tool_calls"][0]["id"] == "functions.Read:1"


def test_answer_lengths_follow_the_workload_and_stop_before_max_tokens(url: str) -> None:
    lo, hi = ANSWER_TOKENS
    lengths = []
    for i in range(6):
        out = chat(url, {"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 32000})
        assert out["choices"][0]["finish_reason"] == "stop"
        lengths.append(out["usage"]["completion_tokens"])
    assert all(lo <= n <= hi for n in lengths) and len(set(lengths)) > 1
    cut = chat(url, {"messages": [{"role": "user", "content": "question 0"}], "max_tokens": 50})
    assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 50
    exact = chat(url, {"messages": [{"role": "user", "content": "q"}], "max_tokens": 1700, "ignore_eos": True})
    assert exact["choices"][0]["finish_reason"] == "length" and exact["usage"]["completion_tokens"] == 1700


def test_scale_shrinks_answers() -> None:
    with run_twin("tiny", time_scale=0.02, answer_scale=0.05) as u:
        n = chat(u, {"messages": [{"role": "user", "content": "hi"}]})["usage"]["completion_tokens"]
    assert 10 <= n <= 75


def test_every_profile_advertises_kimis_context_window(url: str) -> None:
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["max_model_len"] == 262144
    assert httpx.get(f"{url}/get_server_info").json()["context_length"] == 262144
    assert httpx.get(f"{url}/get_model_info").json()["max_model_len"] == 262144
    # Claude Code's and opencode's max_tokens of 32000 fit; only prompt + max_tokens past 262,144 is refused.
    refused = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=30,
        json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 262144},
    )
    assert refused.status_code == 400 and "maximum context length of 262144" in refused.json()["message"]

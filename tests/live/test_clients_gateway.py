"""Real clients through ``python -m gateway.cli serve`` in front of two twins, each once in
passthrough mode (twins serving /v1/responses and /v1/messages, ``surfaces: auto``) and once
translated (twins started as an older chat-only build): Codex CLI ``codex exec`` over
/v1/responses, Claude Code ``claude -p`` over /v1/messages, aider over chat. Each agent task takes a
tool-call round trip; the turns of one conversation stick to one twin and hit its cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from backends.sim.testing import run_twin
from gateway.config.schema import hash_key
from tests.harness import run_gateway
from tests.live.clients import run_aider, run_claude, run_codex

pytestmark = pytest.mark.slow
PROMPT = "What is in this project? Look at it, then answer in one paragraph."
KEY = "cachegate-test"  # the harness's default key


@pytest.fixture(scope="module", params=["passthrough", "translate"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def stack(mode: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    routes = "all" if mode == "passthrough" else "chat"
    kw: dict[str, Any] = {"time_scale": 0.05, "model": "kimi", "stream_interval_s": 0.01, "routes": routes}
    with run_twin("tiny", **kw) as a, run_twin("tiny", **kw) as b:
        path = tmp_path_factory.mktemp(f"gw-{mode}") / "c.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "models": {
                        "kimi": {
                            "backends": [{"url": a, "name": "twin-a"}, {"url": b, "name": "twin-b"}],
                            "surfaces": {"responses": "auto", "messages": "auto"},
                        }
                    },
                    "aliases": {"claude-*": "kimi", "gpt-*": "kimi"},
                    "keys": [{"sha256": hash_key(KEY), "team": "default"}],
                    "health": {"interval_s": 0.5, "load_interval_s": 0.5},
                }
            )
        )
        with run_gateway("--config", str(path)) as gw:
            yield gw, [a, b]


def generations(twins: list[str], before: list[int]) -> list[list[dict[str, Any]]]:
    """Per twin, the generations recorded since ``before`` (counts per twin)."""
    return [
        [e for e in httpx.get(f"{t}/_twin/requests").json()[n:] if "rid" in e]
        for t, n in zip(twins, before, strict=True)
    ]


def counts(twins: list[str]) -> list[int]:
    return [len(httpx.get(f"{t}/_twin/requests").json()) for t in twins]


def one_backend(per_twin: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The conversation's generations (those offering tools), checked to be all on one twin."""
    with_tools = [[g for g in gens if g.get("tools")] for gens in per_twin]
    used = [gens for gens in with_tools if gens]
    assert len(used) == 1, f"one conversation went to {len(used)} backends: {with_tools}"
    return used[0]


def test_codex_exec_through_cachegate(stack: tuple[str, list[str]], mode: str, tmp_path: Path) -> None:
    gw, twins = stack
    before = counts(twins)
    run = run_codex(gw, PROMPT, root=tmp_path, api_key=KEY)
    assert run.exit_code == 0, run.describe()
    gens = one_backend(generations(twins, before))
    expected = "/v1/responses" if mode == "passthrough" else "/v1/chat/completions"
    assert all(g["path"] == expected and g["stream"] for g in gens), gens
    assert gens[0]["finish"] == "tool_calls" and gens[-1]["finish"] == "stop", gens
    answers = [e["item"]["text"] for e in run.json if e.get("type") == "item.completed"
               and e["item"].get("type") == "agent_message"]  # fmt: skip
    assert answers and answers[-1]
    usage = next(e["usage"] for e in reversed(run.json) if e.get("type") == "turn.completed")
    assert usage["cached_input_tokens"] > 0  # the second request resent the first and hit the cache


def test_claude_code_through_cachegate(stack: tuple[str, list[str]], mode: str, tmp_path: Path) -> None:
    gw, twins = stack
    before = counts(twins)
    run = run_claude(gw, PROMPT, root=tmp_path, api_key=KEY, small_model="claude-haiku-4-5")
    assert run.exit_code == 0, run.describe()
    assert run.json is not None and run.json["is_error"] is False, run.describe()
    assert run.json["num_turns"] >= 2 and run.json["result"]
    assert run.json["usage"]["cache_read_input_tokens"] > 0
    if mode == "passthrough":  # anthropic-version and anthropic-beta reach the engine
        posts = [
            e
            for t, n in zip(twins, before, strict=True)
            for e in httpx.get(f"{t}/_twin/requests").json()[n:]
            if e.get("method") == "POST"
        ]
        assert posts and all(
            e["headers"].get("anthropic-version") == "2023-06-01" and e["headers"].get("anthropic-beta") for e in posts
        ), posts
    gens = one_backend(generations(twins, before))
    expected = "/v1/messages" if mode == "passthrough" else "/v1/chat/completions"
    assert all(g["path"] == expected for g in gens), gens
    assert gens[0]["finish"] == "tool_calls" and gens[0]["tool"] == "Read" and gens[-1]["finish"] == "stop"


def test_aider_one_shot_through_cachegate(stack: tuple[str, list[str]], tmp_path: Path) -> None:
    gw, twins = stack
    before = counts(twins)
    run = run_aider(gw, "Describe this project in one sentence.", root=tmp_path, api_key=KEY)
    assert run.exit_code == 0, run.describe()
    gens = [g for per in generations(twins, before) for g in per]
    assert gens and all(g["path"] == "/v1/chat/completions" for g in gens)

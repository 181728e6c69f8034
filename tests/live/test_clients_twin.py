"""Real clients (installed by ``tests/live/clients.py``) against a twin's native routes, no gateway:
Codex CLI over ``/v1/responses``, Claude Code over ``/v1/messages``, aider over chat. Each agent
turn takes a tool-call round trip (the twin calls a tool on the fresh user turn and answers the
tool result with text). Point ``BASE`` at a gateway to run the same checks through it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.sim.testing import run_twin
from tests.live import clients
from tests.live.clients import run_aider, run_claude, run_codex, run_continue, run_opencode

pytestmark = pytest.mark.slow
PROMPT = "What is in this project? Look at it, then answer in one paragraph."


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with run_twin("tiny", time_scale=0.05, model="kimi", stream_interval_s=0.01) as url:
        yield url


def seen(base: str) -> list[dict[str, Any]]:
    return httpx.get(f"{base}/_twin/requests").json()  # type: ignore[no-any-return]


def new_since(base: str, before: int) -> list[dict[str, Any]]:
    return seen(base)[before:]


def test_codex_exec_completes_a_tool_round_trip(base: str, tmp_path: Path) -> None:
    before = len(seen(base))
    run = run_codex(base, PROMPT, root=tmp_path)
    assert run.exit_code == 0, run.describe()
    gens = [e for e in new_since(base, before) if "rid" in e]
    assert all(g["path"] == "/v1/responses" and g["stream"] for g in gens)
    assert gens[0]["finish"] == "tool_calls" and gens[-1]["finish"] == "stop", gens
    answers = [e["item"]["text"] for e in run.json if e.get("type") == "item.completed"
               and e["item"].get("type") == "agent_message"]  # fmt: skip
    assert answers and answers[-1]
    usage = next(e["usage"] for e in reversed(run.json) if e.get("type") == "turn.completed")
    assert usage["cached_input_tokens"] > 0  # the second request resent the first and hit the cache


def test_claude_code_completes_a_tool_round_trip(base: str, tmp_path: Path) -> None:
    before = len(seen(base))
    run = run_claude(base, PROMPT, root=tmp_path)
    assert run.exit_code == 0, run.describe()
    assert run.json is not None and run.json["is_error"] is False, run.describe()
    assert run.json["num_turns"] >= 2 and run.json["result"]
    assert run.json["usage"]["cache_read_input_tokens"] > 0
    new = new_since(base, before)
    assert any(e.get("method") == "HEAD" and e["path"] == "/" for e in new)
    posts = [e for e in new if e.get("method") == "POST"]
    assert posts and all(e["path"] == "/v1/messages" and e["query"] == "beta=true" for e in posts)
    assert all(e["headers"].get("anthropic-version") == "2023-06-01" for e in posts)
    gens = [e for e in new if "rid" in e]
    assert gens[0]["finish"] == "tool_calls" and gens[0]["tool"] == "Read" and gens[-1]["finish"] == "stop"
    assert all(g["max_new_tokens"] == 32000 for g in gens)


def test_aider_one_shot(base: str, tmp_path: Path) -> None:
    before = len(seen(base))
    run = run_aider(base, "Describe this project in one sentence.", root=tmp_path)
    assert run.exit_code == 0, run.describe()
    posts = [e for e in new_since(base, before) if e.get("method") == "POST"]
    assert posts and all(e["path"] == "/v1/chat/completions" and e["status"] == 200 for e in posts)


@pytest.mark.parametrize("runner", [run_opencode, run_continue], ids=["opencode", "continue"])
def test_chat_agents_take_one_round_trip_and_stop(base: str, tmp_path: Path, runner: Any) -> None:
    """opencode and Continue's CLI over chat: one tool call, then text (no loop on the twin)."""
    before = len(seen(base))
    run = runner(base, PROMPT, root=tmp_path)
    assert run.exit_code == 0, run.describe()
    gens = [e for e in new_since(base, before) if "rid" in e and e["tools"]]
    assert [g["finish"] for g in gens] == ["tool_calls", "stop"], gens
    assert gens[0]["tool"].lower() == "read"


def test_an_unreachable_registry_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clients, "CACHE_DIR", tmp_path)
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9/")
    monkeypatch.setenv("npm_config_fetch_retries", "0")
    pkg = clients.Package("npm", "left-pad", "1.3.0", "left-pad", "left-pad")
    with pytest.raises(
        clients.ClientUnavailable, match=r"could not install left-pad@1\.3\.0 from http://127\.0\.0\.1:9/"
    ):
        clients.install(pkg)
    assert not pkg.home.exists()

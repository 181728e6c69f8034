"""Real clients through ``cachegate serve`` in front of a vLLM twin (``sim-backend --engine vllm``,
detected by ``engine: auto``), surfaces translated to chat: Codex CLI ``codex exec`` over /v1/responses
and Claude Code ``claude -p`` over /v1/messages each complete a tool-call round trip."""

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
from tests.live.clients import run_claude, run_codex

# Under 5 s here: not marked slow (the clients are installed once, by tests/live/clients.py).
PROMPT = "What is in this project? Look at it, then answer in one paragraph."
KEY = "cachegate-test"
ADMIN = {"authorization": "Bearer t0ken"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    kw: dict[str, Any] = {"time_scale": 0.05, "model": "kimi", "stream_interval_s": 0.01, "engine": "vllm"}
    with run_twin("tiny", **kw) as twin:
        path = tmp_path_factory.mktemp("gw-vllm") / "c.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "models": {"kimi": {"backends": [{"url": twin, "name": "vllm-twin"}]}},
                    "aliases": {"claude-*": "kimi", "gpt-*": "kimi"},
                    "keys": [{"sha256": hash_key(KEY), "team": "default"}],
                    "health": {"interval_s": 0.5, "load_interval_s": 0.5},
                }
            )
        )
        with run_gateway("--config", str(path), "--admin-token", "t0ken") as gw:
            backend = httpx.get(gw + "/admin/state", headers=ADMIN).json()["backends"]["vllm-twin"]
            assert backend["engine"] == "vllm" and backend["capacity"]["source"] == "reported"
            yield gw, twin


def generations(twin: str, since: int) -> list[dict[str, Any]]:
    return [e for e in httpx.get(f"{twin}/_twin/requests").json()[since:] if "rid" in e and e.get("tools")]


def seen(twin: str) -> int:
    return len(httpx.get(f"{twin}/_twin/requests").json())


def test_codex_exec_through_cachegate_to_vllm(stack: tuple[str, str], tmp_path: Path) -> None:
    gw, twin = stack
    before = seen(twin)
    run = run_codex(gw, PROMPT, root=tmp_path, api_key=KEY)
    assert run.exit_code == 0, run.describe()
    gens = generations(twin, before)
    assert gens and all(g["path"] == "/v1/chat/completions" and g["stream"] for g in gens), gens
    assert gens[0]["finish"] == "tool_calls" and gens[-1]["finish"] == "stop", gens
    answers = [e["item"]["text"] for e in run.json if e.get("type") == "item.completed"
               and e["item"].get("type") == "agent_message"]  # fmt: skip
    assert answers and answers[-1]


def test_claude_code_through_cachegate_to_vllm(stack: tuple[str, str], tmp_path: Path) -> None:
    gw, twin = stack
    before = seen(twin)
    run = run_claude(gw, PROMPT, root=tmp_path, api_key=KEY, small_model="claude-haiku-4-5")
    assert run.exit_code == 0, run.describe()
    assert run.json is not None and run.json["is_error"] is False, run.describe()
    assert run.json["num_turns"] >= 2 and run.json["result"]
    gens = generations(twin, before)
    assert gens and all(g["path"] == "/v1/chat/completions" for g in gens), gens
    assert gens[0]["finish"] == "tool_calls" and gens[0]["tool"] == "Read" and gens[-1]["finish"] == "stop"

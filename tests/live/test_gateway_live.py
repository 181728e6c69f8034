"""The `gateway` stack live: real gateway process, simulated SGLang twins, real HTTP."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from backends.sim.testing import run_twin, twin_of
from tests.harness import run_gateway

MODEL = "moonshotai/Kimi-K2-Instruct"


def _config(path: Path, *urls: str, **extra: object) -> str:
    path.write_text(
        yaml.safe_dump(
            {
                "models": {"kimi": {"upstream_model": MODEL, "backends": [{"url": u} for u in urls]}},
                "health": {"interval_s": 0.5, "load_interval_s": 0.5},
                **extra,
            }
        )
    )
    return str(path)


@pytest.mark.slow  # > 5 s here
def test_conversations_keep_their_backend_and_hit_its_cache(tmp_path: Path) -> None:
    with (
        run_twin("tiny", model=MODEL) as t0,
        run_twin("tiny", model=MODEL) as t1,
        run_gateway("--config", _config(tmp_path / "c.yaml", t0, t1)) as base,
    ):
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
        system = {"role": "system", "content": "You are a careful coding agent. " * 60}
        histories = {c: [system, {"role": "user", "content": f"conversation {c}: " + "q" * 2500}] for c in range(6)}
        served: dict[int, set[str]] = {c: set() for c in histories}
        previous: dict[int, int] = {}
        for turn in range(3):
            for c, messages in histories.items():
                before = {u: twin_of(u).engine.counters.requests for u in (t0, t1)}
                reply = client.chat.completions.create(model="kimi", messages=messages, max_tokens=12)
                after = {u: twin_of(u).engine.counters.requests for u in (t0, t1)}
                served[c] |= {u for u in (t0, t1) if after[u] > before[u]}
                usage = reply.usage
                assert usage is not None and usage.prompt_tokens_details is not None
                if turn:  # the whole previous prompt is served from the cache (to a 16-token page)
                    assert usage.prompt_tokens_details.cached_tokens >= previous[c] - 16, (c, turn)
                previous[c] = usage.prompt_tokens
                messages += [
                    {"role": "assistant", "content": reply.choices[0].message.content},
                    {"role": "user", "content": "tool result: " + "r" * 800},
                ]
        assert all(len(backends) == 1 for backends in served.values()), served
        assert len(set().union(*served.values())) == 2, "conversations spread over both backends"


def test_refusals_over_http_and_waiting_gets_no_bytes(tmp_path: Path) -> None:
    teams = {"default": {"max_concurrency": 1, "max_queue": 1, "queue_timeout_s": 1.0}}
    with (
        run_twin("tiny", model=MODEL) as twin,
        run_gateway("--config", _config(tmp_path / "c.yaml", twin, teams=teams)) as base,
    ):
        body = {"model": "kimi", "stream": True, "max_tokens": 200, "messages": [{"role": "user", "content": "long"}]}
        first_started = threading.Event()
        results: dict[str, tuple[int, bytes, dict[str, str], float]] = {}

        def call(name: str) -> None:
            start = time.monotonic()
            with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=30) as r:
                if name == "running":
                    first_started.set()
                data = b"".join(r.iter_raw())
            results[name] = (r.status_code, data, dict(r.headers), time.monotonic() - start)

        running = threading.Thread(target=call, args=("running",))
        running.start()
        assert first_started.wait(10)
        waiting = threading.Thread(target=call, args=("waiting",))
        waiting.start()
        time.sleep(0.3)
        call("refused")
        waiting.join(10)
        running.join(30)
    status, data, headers, _ = results["refused"]
    assert status == 429 and int(headers["retry-after"]) >= 1
    assert httpx.Response(429, content=data).json()["error"]["code"] == "team_queue_full"
    status, data, headers, took = results["waiting"]
    error = httpx.Response(status, content=data).json()["error"]  # one complete JSON body, no SSE bytes before it
    assert status == 429 and error["code"] == "queue_timeout" and int(headers["retry-after"]) >= 1
    assert 0.9 < took < 5
    assert results["running"][0] == 200 and results["running"][1].endswith(b"data: [DONE]\n\n")


def test_dp_backend_turns_are_pinned_to_one_rank(tmp_path: Path) -> None:
    """A DP-attention server keeps one cache per rank: turns of a conversation must reach the same rank
    (``routed_dp_rank``), or the server's own round-robin would send them to a rank that holds nothing."""
    with run_twin("b300-dp8-fp8", model=MODEL, time_scale=0.002) as twin:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            yaml.safe_dump({"models": {"kimi": {"upstream_model": MODEL, "backends": [{"url": twin, "dp_size": 8}]}}})
        )
        with run_gateway("--config", str(cfg)) as base:
            client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
            for c in range(4):
                messages = [{"role": "user", "content": f"conversation {c}: " + "p" * 20_000}]
                previous = 0
                for turn in range(3):
                    reply = client.chat.completions.create(model="kimi", messages=messages, max_tokens=8)
                    usage = reply.usage
                    assert usage is not None and usage.prompt_tokens_details is not None
                    if turn:
                        assert usage.prompt_tokens_details.cached_tokens >= previous - 64, (c, turn)
                    previous = usage.prompt_tokens
                    messages += [
                        {"role": "assistant", "content": reply.choices[0].message.content},
                        {"role": "user", "content": "next " + "n" * 400},
                    ]
        used = [load.num_running_reqs + load.extra.get("cached_tokens", 0) for load in twin_of(twin).engine.loads()]
        assert sum(1 for u in used if u) >= 2, f"conversations spread over several ranks: {used}"


@pytest.mark.slow  # > 5 s here
def test_client_that_leaves_while_waiting_gives_its_place_back(tmp_path: Path) -> None:
    teams = {"default": {"max_concurrency": 1, "max_queue": 4, "queue_timeout_s": 30}}
    admin = {"authorization": "Bearer t0ken"}
    with (
        run_twin("tiny", model=MODEL) as twin,
        run_gateway("--config", _config(tmp_path / "c.yaml", twin, teams=teams), "--admin-token", "t0ken") as base,
    ):
        body = {
            "model": "kimi",
            "stream": True,
            "max_tokens": 400,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": "x"}],
        }
        started = threading.Event()

        def hold() -> None:
            with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=30) as r:
                started.set()
                b"".join(r.iter_raw())

        holder = threading.Thread(target=hold)
        holder.start()
        assert started.wait(10)
        # It waits half a second in the queue, then leaves.
        with httpx.Client(timeout=httpx.Timeout(30, read=0.5)) as impatient, contextlib.suppress(httpx.ReadTimeout):
            impatient.post(base + "/v1/chat/completions", json=body)
        deadline = time.monotonic() + 1  # well before the holder's 400 tokens are done
        while httpx.get(base + "/admin/teams/default", headers=admin).json()["waiting"] != 0:
            assert time.monotonic() < deadline, "the request that left still holds a place in the queue"
            time.sleep(0.05)
        holder.join(30)
        assert httpx.get(base + "/admin/teams/default", headers=admin).json()["inflight"] == 0
        quick = httpx.post(base + "/v1/chat/completions", timeout=30, json={**body, "stream": False, "max_tokens": 4})
        assert quick.status_code == 200, "nothing is left holding the team's only slot"
        assert twin_of(twin).max_live == 1, "the request that left never reached the backend"

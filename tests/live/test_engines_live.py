"""A vLLM twin behind `cachegate serve`: the gateway reads its capacity from ``vllm:cache_config_info``
(configured ``engine: vllm`` or detected by ``auto``), so KV-aware admission engages (the seat budget in
``/admin/state``), and DP ranks are pinned with vLLM's header. Real processes, real HTTP, the openai SDK."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from backends.sim.testing import run_twin, twin_of
from policies.admission import SeatParams
from tests.harness import run_gateway

MODEL = "moonshotai/Kimi-K2-Instruct"
ADMIN = {"authorization": "Bearer t0ken"}


def _config(path: Path, backend: dict[str, object]) -> str:
    path.write_text(
        yaml.safe_dump(
            {
                "models": {"kimi": {"upstream_model": MODEL, "backends": [backend]}},
                "health": {"interval_s": 0.5, "load_interval_s": 0.5},
            }
        )
    )
    return str(path)


@pytest.mark.parametrize("engine", ["vllm", "auto"])
def test_a_vllm_twin_gets_kv_aware_admission_from_its_cache_config_info(tmp_path: Path, engine: str) -> None:
    with (
        run_twin("b300-dp2-bf16", model=MODEL, time_scale=0.02, engine="vllm") as twin,
        run_gateway(
            "--config",
            _config(tmp_path / "c.yaml", {"url": twin, "name": "v0", "engine": engine, "dp_size": 2}),
            "--admin-token",
            "t0ken",
        ) as base,
    ):
        per_rank = twin_of(twin).engine.loads()[0].max_total_num_tokens // 16 * 16
        state = httpx.get(base + "/admin/state", headers=ADMIN).json()
        backend = state["backends"]["v0"]
        assert backend["engine"] == "vllm"
        assert backend["capacity"]["source"] == "reported"
        assert backend["capacity"]["kv_tokens_per_rank"] == per_rank
        assert backend["capacity"]["context_tokens"] == 262_144
        assert backend["capacity"]["seat_budget_tokens"] == int(SeatParams().admit_water * per_rank)

        client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
        for i in range(4):
            out = client.chat.completions.create(
                model="kimi", max_tokens=8, messages=[{"role": "user", "content": f"conversation {i}: hello"}]
            )
            assert out.choices[0].message.content
        seats = httpx.get(base + "/admin/state", headers=ADMIN).json()["core"]["backends"]
        assert set(seats) <= {"v0#0", "v0#1"} and sum(s["seats"] for s in seats.values()) >= 1
        assert all(s["reserved_tokens"] > 0 for s in seats.values() if s["seats"])
        pinned = [
            r["headers"].get("x-data-parallel-rank")
            for r in httpx.get(twin + "/_twin/requests").json()
            if r.get("path") == "/v1/chat/completions" and "headers" in r
        ]
        assert len(pinned) == 4 and set(pinned) <= {"0", "1"}, pinned


def test_an_endpoint_without_signals_gets_a_learned_limit_that_caps_what_reaches_it(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    backend = {"url": "", "name": "hosted", "engine": "openai"}
    with run_twin("tiny", model=MODEL, time_scale=0.2, engine="vllm") as twin:
        backend["url"] = twin
        cfg.write_text(
            yaml.safe_dump(
                {
                    "models": {"kimi": {"upstream_model": MODEL, "backends": [backend]}},
                    "admission": {"idle_release_s": 0.5},  # seats of finished conversations come back fast
                }
            )
        )
        with run_gateway("--config", str(cfg), "--admin-token", "t0ken") as base:
            capacity = httpx.get(base + "/admin/state", headers=ADMIN).json()["backends"]["hosted"]["capacity"]
            assert capacity["source"] == "learned" and capacity["kv_tokens_per_rank"] == 0
            assert capacity["max_running_requests"] == 8 and capacity["learned"]["samples"] == 0

            def turn(i: int) -> int:
                body = {"model": "kimi", "stream": True, "max_tokens": 60, "ignore_eos": True,
                        "messages": [{"role": "user", "content": f"conversation {i}"}]}  # fmt: skip
                with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=60) as r:
                    return r.status_code if b"[DONE]" in b"".join(r.iter_raw()) else -1

            with ThreadPoolExecutor(16) as pool:
                codes = list(pool.map(turn, range(16)))
            learned = httpx.get(base + "/admin/state", headers=ADMIN).json()["backends"]["hosted"]["capacity"]
        peak = twin_of(twin).max_live
    assert codes == [200] * 16
    assert learned["learned"]["samples"] == 16  # every streamed answer's time to first token was a sample
    # 16 conversations at once: the learned limit (8 until 16 samples move it) let at most 1.2 × 8 through.
    assert 4 <= peak <= 10, peak


def test_a_mixed_fleet_behind_one_alias(tmp_path: Path) -> None:
    """An SGLang twin and a vLLM twin under one model, both detected: every conversation completes its
    turns, both engines serve, and each backend's capacity is what its own engine reported."""
    with (
        run_twin("tiny", model=MODEL, time_scale=0.02) as sglang,
        run_twin("tiny", model=MODEL, time_scale=0.02, engine="vllm") as vllm,
    ):
        cfg = tmp_path / "c.yaml"
        backends = [{"url": sglang, "name": "s0"}, {"url": vllm, "name": "v0"}]
        cfg.write_text(yaml.safe_dump({"models": {"kimi": {"upstream_model": MODEL, "backends": backends}}}))
        with run_gateway("--config", str(cfg), "--admin-token", "t0ken") as base:
            state = httpx.get(base + "/admin/state", headers=ADMIN).json()["backends"]
            assert {n: b["engine"] for n, b in state.items()} == {"s0": "sglang", "v0": "vllm"}
            assert state["s0"]["capacity"]["kv_tokens_per_rank"] == twin_of(sglang).engine.max_total_num_tokens
            assert state["v0"]["capacity"]["kv_tokens_per_rank"] == twin_of(vllm).engine.max_total_num_tokens
            assert all(b["capacity"]["source"] == "reported" for b in state.values())
            client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0)

            def conversation(i: int) -> int:
                messages: list[dict[str, str]] = [{"role": "user", "content": f"conversation {i} " + "x" * 2000}]
                for _ in range(2):
                    out = client.chat.completions.create(model="kimi", max_tokens=16, messages=messages)
                    messages += [{"role": "assistant", "content": out.choices[0].message.content or ""},
                                 {"role": "user", "content": "go on"}]  # fmt: skip
                return 2

            with ThreadPoolExecutor(8) as pool:
                turns = list(pool.map(conversation, range(8)))
        served = {name: twin_of(url).engine.counters.requests for name, url in (("s0", sglang), ("v0", vllm))}
    assert turns == [2] * 8
    assert sum(served.values()) == 16 and all(served.values()), served

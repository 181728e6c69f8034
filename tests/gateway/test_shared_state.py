"""Team limits shared by gateway replicas through a real Redis, and the admin API.

Gateways run as real processes; the backend is a simulated SGLang twin in this process, so the
test counts concurrency where it matters: at the backend.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
import yaml

from backends.sim.testing import run_twin, twin_of
from gateway.state.redis_scripts import live_leases
from loadtest.bench.procs import RedisServer
from tests.harness import run_gateway

MODEL = "moonshotai/Kimi-K2-Instruct"
KEY, ADMIN = "sk-swarm", "admin-secret"
pytestmark = pytest.mark.redis


def config(path: Path, twin: str, redis_url: str | None, **team: object) -> str:
    data = {
        "models": {"kimi": {"upstream_model": MODEL, "backends": [{"url": twin}]}},
        "teams": {"swarm": {"max_concurrency": 4, "max_queue": 100, "queue_timeout_s": 60, **team}},
        "keys": [{"sha256": __import__("hashlib").sha256(KEY.encode()).hexdigest(), "team": "swarm"}],
        "health": {"interval_s": 0.5, "load_interval_s": 0.5},
        "lease_ttl_s": 2.0,
        "workers": 1,  # one replica per process: the tests count replicas
        "redis_url": redis_url,
    }
    path.write_text(yaml.safe_dump(data))
    return str(path)


def stream(base: str, i: int, max_tokens: int = 60) -> int:
    body = {
        "model": "kimi",
        "stream": True,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": f"conversation {i}: " + "x" * 2000}],
    }
    with httpx.stream(
        "POST", base + "/v1/chat/completions", json=body, timeout=60, headers={"authorization": f"Bearer {KEY}"}
    ) as response:
        body_bytes = b"".join(response.iter_raw())
    assert response.status_code != 200 or body_bytes.endswith(b"data: [DONE]\n\n")
    return response.status_code


@pytest.fixture()
def twin() -> Iterator[str]:
    with run_twin("tiny", time_scale=1.0, model=MODEL) as url:
        yield url


@pytest.mark.slow  # > 5 s here
def test_team_limit_holds_across_two_gateways(twin: str, redis_url: str, tmp_path: Path) -> None:
    cfg = config(tmp_path / "c.yaml", twin, redis_url)
    with run_gateway("--config", cfg) as a, run_gateway("--config", cfg) as b, ThreadPoolExecutor(20) as pool:
        statuses = list(pool.map(lambda i: stream(a if i % 2 else b, i), range(20)))
    assert statuses == [200] * 20
    seen = twin_of(twin).max_live
    assert 3 <= seen <= 4, f"the backend saw {seen} requests at once; the team limit is 4"
    assert live_leases(redis_url) == {}, "no lease is left behind"


@pytest.mark.slow  # > 5 s here
def test_slots_of_a_killed_gateway_come_back_within_the_lease_ttl(twin: str, redis_url: str, tmp_path: Path) -> None:
    cfg = config(tmp_path / "c.yaml", twin, redis_url)
    with ExitStack() as stack:
        a = stack.enter_context(run_gateway("--config", cfg))
        b = stack.enter_context(run_gateway("--config", cfg))
        holders = [threading.Thread(target=lambda i=i: _quiet(stream, a, i, 3000), daemon=True) for i in range(4)]
        for t in holders:
            t.start()
        deadline = time.monotonic() + 10
        while live_leases(redis_url).get("swarm", 0) < 4:
            assert time.monotonic() < deadline, "gateway A never took the team's 4 slots"
            time.sleep(0.05)
        os.kill(a.pid, signal.SIGKILL)
        killed = time.monotonic()
        assert stream(b, 99, max_tokens=5) == 200
        waited = time.monotonic() - killed
        assert waited < 2.0 + 2.5, f"slots came back after {waited:.1f} s (lease TTL 2 s)"


def _quiet(fn: object, *args: object) -> None:
    with contextlib.suppress(httpx.HTTPError, AssertionError):  # its gateway is killed mid-stream
        fn(*args)  # type: ignore[operator]


@pytest.mark.slow  # > 5 s here
def test_redis_outage_degrades_and_recovers_without_failures(
    twin: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    cfg = config(tmp_path / "c.yaml", twin, redis_server.url)
    results: list[int] = []
    modes: set[str] = set()
    stop = threading.Event()
    with run_gateway("--config", cfg) as base:

        def load(worker: int) -> None:
            i = 0
            while not stop.is_set():
                results.append(stream(base, worker * 1000 + i, max_tokens=20))
                i += 1

        threads = [threading.Thread(target=load, args=(w,)) for w in range(3)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        redis_server.stop()
        deadline = time.monotonic() + 8
        while "degraded" not in modes and time.monotonic() < deadline:
            modes.add(httpx.get(base + "/readyz").json()["state"]["mode"])
            time.sleep(0.1)
        degraded_metric = "cachegate_redis_degraded 1.0" in httpx.get(base + "/metrics").text
        time.sleep(1.0)
        redis_server.start()
        deadline = time.monotonic() + 8
        while httpx.get(base + "/readyz").json()["state"]["mode"] != "redis":
            assert time.monotonic() < deadline, "never returned to shared enforcement"
            time.sleep(0.1)
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(30)
        deadline = time.monotonic() + 3.5  # at worst a lease expires with its TTL (2 s)
        while live_leases(redis_server.url, ttl_s=2.0):
            assert time.monotonic() < deadline, "a lease was left behind"
            time.sleep(0.1)
    assert "degraded" in modes and degraded_metric
    assert results and set(results) == {200}, f"requests failed during the outage: {results}"


@pytest.mark.slow  # > 5 s here
def test_admin_changes_reach_every_replica_and_survive_restart(twin: str, redis_url: str, tmp_path: Path) -> None:
    cfg = config(tmp_path / "c.yaml", twin, redis_url)
    env = {"CACHEGATE_ADMIN_TOKEN": ADMIN}
    auth = {"authorization": f"Bearer {ADMIN}"}
    with run_gateway("--config", cfg, env=env) as a, run_gateway("--config", cfg, env=env) as b:
        assert httpx.put(a + "/admin/teams/newteam", json={"max_concurrency": 3}).status_code == 401
        assert httpx.get(a + "/admin/state", headers={"authorization": "Bearer nope"}).status_code == 401
        put = httpx.put(a + "/admin/teams/newteam", json={"max_concurrency": 3, "weight": 2}, headers=auth)
        assert put.status_code == 200 and put.json()["limits"]["max_concurrency"] == 3
        deadline = time.monotonic() + 1.0
        while httpx.get(b + "/admin/teams/newteam", headers=auth).json()["limits"]["max_concurrency"] != 3:
            assert time.monotonic() < deadline, "the change did not reach the other replica within 1 s"
            time.sleep(0.05)
        bad = httpx.put(a + "/admin/teams/newteam", json={"max_concurrency": -1}, headers=auth)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_concurrency"
        bad = httpx.put(a + "/admin/teams/newteam", json={"speed": 1}, headers=auth)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"
        state = httpx.get(b + "/admin/state", headers=auth).json()
        assert state["state"]["mode"] == "redis" and state["state"]["replicas"] == 2
    with run_gateway("--config", cfg, env=env) as c:
        limits = httpx.get(c + "/admin/teams/newteam", headers=auth).json()["limits"]
        assert limits["max_concurrency"] == 3 and limits["weight"] == 2


def test_admin_api_in_memory_and_off(twin: str, tmp_path: Path) -> None:
    cfg = config(tmp_path / "c.yaml", twin, None)
    with run_gateway("--config", cfg, "--admin-token", ADMIN) as base:
        auth = {"authorization": f"Bearer {ADMIN}"}
        assert httpx.get(base + "/admin/teams/swarm", headers=auth).json()["limits"]["max_concurrency"] == 4
        httpx.put(base + "/admin/teams/swarm", json={"max_concurrency": 1}, headers=auth).raise_for_status()
        assert httpx.get(base + "/admin/teams/swarm", headers=auth).json()["limits"]["max_concurrency"] == 1
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(lambda i: stream(base, i, 30), range(4))) == [200] * 4
        assert twin_of(twin).max_live == 1, "the runtime limit of 1 applies to new requests"
    with run_gateway("--config", cfg) as base:
        off = httpx.get(base + "/admin/state", headers={"authorization": "Bearer x"})
        assert off.status_code == 404 and off.json()["error"]["code"] == "admin_disabled"


@pytest.mark.slow  # > 5 s here
def test_without_redis_each_replica_enforces_its_share(twin: str, redis_server: RedisServer, tmp_path: Path) -> None:
    cfg = config(tmp_path / "c.yaml", twin, redis_server.url)
    with run_gateway("--config", cfg) as a, run_gateway("--config", cfg) as b:
        deadline = time.monotonic() + 5
        while httpx.get(a + "/readyz").json()["state"]["replicas"] != 2:  # both heartbeats seen
            assert time.monotonic() < deadline
            time.sleep(0.1)
        redis_server.stop()
        for base in (a, b):
            deadline = time.monotonic() + 8
            while httpx.get(base + "/readyz").json()["state"]["mode"] != "degraded":
                assert time.monotonic() < deadline, "the replica did not notice Redis was gone"
                time.sleep(0.1)
        twin_of(twin).max_live = 0
        with ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(lambda i: stream(a if i % 2 else b, 500 + i), range(16)))
        assert statuses == [200] * 16, "requests are served without Redis"
        seen = twin_of(twin).max_live
        assert 2 <= seen <= 4, f"two replicas with half of the limit of 4 each let {seen} through at once"


def test_two_gateways_hold_the_limit_across_redis_restarts_and_a_flush(
    twin: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    cfg = config(tmp_path / "c.yaml", twin, redis_server.url)
    results: list[int] = []
    stop = threading.Event()
    with run_gateway("--config", cfg) as a, run_gateway("--config", cfg) as b:
        for base in (a, b):
            deadline = time.monotonic() + 8
            while httpx.get(base + "/readyz").json()["state"]["mode"] != "redis":
                assert time.monotonic() < deadline, "a replica never reached shared mode"
                time.sleep(0.1)

        def load(worker: int) -> None:
            i = 0
            while not stop.is_set():
                results.append(stream(a if worker % 2 else b, worker * 1000 + i, max_tokens=8))
                i += 1

        twin_of(twin).max_live = 0
        threads = [threading.Thread(target=load, args=(w,)) for w in range(10)]
        for t in threads:
            t.start()
        for fault in ("restart", "flush", "restart"):
            time.sleep(1.5)
            if fault == "restart":
                redis_server.stop()
                time.sleep(0.5)
                redis_server.start()
            else:
                redis_server.client().flushall()
            for base in (a, b):
                deadline = time.monotonic() + 10
                while httpx.get(base + "/readyz").json()["state"]["mode"] != "redis":
                    assert time.monotonic() < deadline, f"a replica never came back after the {fault}"
                    time.sleep(0.1)
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(60)
        transitions = [httpx.get(base + "/readyz").json()["state"]["transitions"] for base in (a, b)]
    seen = twin_of(twin).max_live
    assert results and set(results) == {200}, f"requests failed: {sorted(set(results))}"
    assert seen <= 4, f"the backend saw {seen} requests of the team at once; its limit is 4"
    assert all(t <= 2 * 3 + 1 for t in transitions), f"mode changes per replica over 3 faults: {transitions}"


def test_runtime_limits_survive_a_redis_restart(twin: str, redis_server: RedisServer, tmp_path: Path) -> None:
    cfg = config(tmp_path / "c.yaml", twin, redis_server.url)
    env = {"CACHEGATE_ADMIN_TOKEN": ADMIN}
    auth = {"authorization": f"Bearer {ADMIN}"}
    with run_gateway("--config", cfg, env=env) as a:
        put = httpx.put(a + "/admin/teams/swarm", json={"max_concurrency": 2}, headers=auth)
        assert put.status_code == 200
        redis_server.stop()
        redis_server.start()  # empty: the private server keeps nothing on disk
        deadline = time.monotonic() + 10
        while httpx.get(a + "/readyz").json()["state"]["mode"] != "redis":
            assert time.monotonic() < deadline, "never back to shared mode"
            time.sleep(0.1)
        with run_gateway("--config", cfg, env=env) as c:  # started after the restart: reads Redis
            limits = httpx.get(c + "/admin/teams/swarm", headers=auth).json()["limits"]
    assert limits["max_concurrency"] == 2, f"a replica started after the restart sees {limits}"

"""Live failover: kill one of three simulated SGLang servers during a load through the gateway."""

from __future__ import annotations

import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest
import yaml

from backends.sim.testing import spawn_twin
from tests.harness import run_gateway

MODEL = "moonshotai/Kimi-K2-Instruct"


@dataclass
class Turn:
    started: float
    ended: float
    status: int
    body: bytes


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _requests_at(twin: str) -> float:
    return _metric(httpx.get(twin + "/metrics").text, "sglang:num_requests_total")


@pytest.mark.slow  # > 5 s here
def test_killed_backend_is_cut_off_streams_end_cleanly_and_it_comes_back(tmp_path: Path) -> None:
    turns: list[Turn] = []
    stop = threading.Event()
    with spawn_twin("tiny") as t0, spawn_twin("tiny") as t1, spawn_twin("tiny") as t2:
        dead_port = int(t0.rsplit(":", 1)[1])
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "models": {"kimi": {"upstream_model": MODEL, "backends": [{"url": str(u)} for u in (t0, t1, t2)]}},
                    "health": {"interval_s": 0.3, "load_interval_s": 0.5, "timeout_s": 1.0},
                    "teams": {"default": {"max_concurrency": 64, "max_queue": 256}},
                }
            )
        )
        with run_gateway("--config", str(cfg)) as base:

            def worker(w: int) -> None:
                n = 0
                with httpx.Client(timeout=30) as client:
                    while not stop.is_set():
                        n += 1
                        messages = [{"role": "user", "content": f"worker {w} task {n}: " + "x" * 1500}]
                        for _ in range(2):  # a two-turn conversation, then a new one
                            start = time.monotonic()
                            with client.stream(
                                "POST",
                                base + "/v1/chat/completions",
                                json={"model": "kimi", "stream": True, "max_tokens": 120, "messages": messages},
                            ) as r:
                                body = b"".join(r.iter_raw())
                            turns.append(Turn(start, time.monotonic(), r.status_code, body))
                            text = b"".join(re.findall(rb'"content":"([^"]*)"', body)).decode()
                            messages = [
                                *messages,
                                {"role": "assistant", "content": text},
                                {"role": "user", "content": "go on " + "y" * 300},
                            ]

            threads = [threading.Thread(target=worker, args=(w,)) for w in range(9)]
            for t in threads:
                t.start()
            time.sleep(2.5)
            assert _requests_at(t0) > 0, "the load reached every backend before the kill"
            t0.proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            opened_at = None
            while time.monotonic() - killed < 5:
                metrics = httpx.get(base + "/metrics").text
                # Out of rotation: its breaker opened, or its health checks failed, whichever came first.
                if (
                    opened_at is None
                    and _metric(metrics, "cachegate_backend_healthy", backend=f"127.0.0.1:{dead_port}") == 0
                ):
                    opened_at = time.monotonic()
                    errors_at_open = _metric(
                        metrics, "cachegate_upstream_errors_total", backend=f"127.0.0.1:{dead_port}"
                    )
                time.sleep(0.1)
            assert opened_at is not None and opened_at - killed < 2.0, "the dead backend left rotation"
            errors_later = _metric(
                httpx.get(base + "/metrics").text, "cachegate_upstream_errors_total", backend=f"127.0.0.1:{dead_port}"
            )
            assert errors_later == errors_at_open, "no request was sent to the dead backend once out of rotation"
            with spawn_twin("tiny", port=dead_port) as back:
                deadline = time.monotonic() + 15
                while (
                    _metric(
                        httpx.get(base + "/metrics").text, "cachegate_backend_healthy", backend=f"127.0.0.1:{dead_port}"
                    )
                    != 1
                ):
                    assert time.monotonic() < deadline, "the backend never came back into rotation"
                    time.sleep(0.2)
                # New conversations reach it once the router sees its load (polled every 0.5 s);
                # on a busy 2-core machine that can take a few polls.
                deadline = time.monotonic() + 10
                while (used_again := _requests_at(back)) == 0 and time.monotonic() < deadline:
                    time.sleep(0.2)
                stop.set()
                for t in threads:
                    t.join(30)
            assert used_again > 0, "new conversations go to the recovered backend"
    broken = [t for t in turns if t.status == 200 and b'"error"' in t.body]
    assert broken, "some streams were in flight on the killed backend"
    for t in broken:
        assert t.started < killed + 0.5, "only streams already running on the dead backend break"
        events = [e for e in t.body.split(b"\n\n") if e.startswith(b"data: {")]
        error = orjson.loads(events[-1][6:])["error"]
        assert error["message"] and error["code"] in ("upstream_stream_broken", "upstream_timeout")
        assert t.body.endswith(b"data: [DONE]\n\n")
    after = [t for t in turns if t.started > killed + 0.5]
    assert len(after) > 20 and all(t.status == 200 and b'"error"' not in t.body for t in after), (
        "the rest of the load continues without errors"
    )

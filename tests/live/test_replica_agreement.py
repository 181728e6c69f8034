"""Two gateway processes with no shared state place the same new conversation on the same backend."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
import yaml

from tests.fake_upstream import SERVED, FakeUpstream
from tests.harness import run_gateway

SYSTEM = "You are a coding agent. " * 200  # a system prompt every conversation shares


@pytest.mark.slow  # > 5 s here
def test_two_gateways_agree_on_new_conversations(tmp_path: Path) -> None:
    ups = [FakeUpstream(kv_tokens=50_000_000) for _ in range(3)]
    with ExitStack() as stack:
        for up in ups:
            stack.enter_context(up.running())
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "models": {"kimi": {"upstream_model": SERVED, "backends": [{"url": u.url} for u in ups]}},
                    "policy": "gateway",
                }
            )
        )
        a = stack.enter_context(run_gateway("--config", str(cfg)))
        b = stack.enter_context(run_gateway("--config", str(cfg)))
        where: dict[str, int] = {}
        for up in ups:
            up.requests.clear()

        client = stack.enter_context(httpx.Client(timeout=30))

        def send(base: str, n: int) -> str:
            body = {
                "model": "kimi",
                "max_tokens": 16,
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"task {n}: fix the failing test in module_{n}.py " + "z" * 3000},
                ],
            }
            response = client.post(base + "/v1/chat/completions", json=body)
            assert response.status_code == 200
            return response.headers["x-request-id"]

        pairs = [(send(a, n), send(b, n)) for n in range(1000)]
        for i, up in enumerate(ups):
            for request in up.requests:
                where[request["headers"]["x-request-id"]] = i
    agree = sum(where[ra] == where[rb] for ra, rb in pairs)
    spread = [sum(1 for ra, _ in pairs if where[ra] == i) for i in range(3)]
    assert agree >= 950, f"only {agree} of 1000 new conversations went to the same backend"
    assert min(spread) > 200, f"new conversations must spread over the backends: {spread}"

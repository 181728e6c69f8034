"""Builders for the routing tests: chained block fingerprints, requests, backend views, a routed send."""

from __future__ import annotations

from policies.routers import LeastLoad, MinTTFT
from policies.routers.base import mix64, stable_hash
from policies.types import BackendView, Dispatch, Fingerprint, Outcome, RequestFacts

REASONS = {"prefix", "cold_hash", "least_wait", "imbalance", "retry"}
BLOCK = 1024


def chain(label: str, tokens: int, parent: Fingerprint = ()) -> Fingerprint:
    """Chained blocks of ``tokens`` tokens after ``parent`` (keys stable across processes)."""
    out = list(parent)
    for i in range(0, tokens, BLOCK):
        prev = out[-1][0] if out else 0
        out.append((mix64(prev ^ stable_hash(f"{label}#{i}")), min(BLOCK, tokens - i)))
    return tuple(out)


SYSTEM = chain("system", 15_000)


def req(rid: str, fp: Fingerprint, conversation: str | None = None) -> RequestFacts:
    return RequestFacts(
        rid=rid, model="m", prompt_tokens=sum(n for _, n in fp), fingerprint=fp, conversation=conversation
    )


def views(n: int, dp: int = 1, kv: int = 5_000_000) -> list[BackendView]:
    return [BackendView(name=f"b{i}", kv_tokens=kv, dp_size=dp) for i in range(n)]


def send(
    router: MinTTFT | LeastLoad,
    r: RequestFacts,
    backends: list[BackendView],
    now: float,
    *,
    finish: bool = True,
    ttft: float = 0.3,
) -> Dispatch:
    d = router.route(r, backends, now)
    assert d is not None and d.reason in REASONS
    router.dispatched(r, d, now)
    if finish:
        router.first_token(r.rid, now + ttft)
        router.finished(r.rid, d.backend, Outcome(prompt_tokens=r.prompt_tokens), now + ttft + 1)
    return d


def warm_up_common(router: MinTTFT, backends: list[BackendView]) -> None:
    """Two conversations share the system prompt, so it becomes a known branch point."""
    for i in range(2):
        send(router, req(f"w{i}", chain(f"warm{i}", 5000, SYSTEM)), backends, 0.0)

"""The simulator's side of the live path: what ``cachegate serve`` does around the decision core,
without asyncio and in virtual time, so that ``loadtest/sim/simulate.py`` measures what runs live.

- ``LiveFacts``: a request's facts as the gateway computes them (``gateway/request/lifecycle.py``): the
  fingerprint's tokens estimated from bytes with the ratio ``policies/tokens.py::TokenEstimator``
  learns from reported usage, ``max_output_tokens`` what the client sent as ``max_tokens`` (not the
  true output length), no conversation id (admission infers it from the prompt's anchor). With
  ``oracle`` it hands the core the true token counts, output length and conversation id instead: a
  ceiling, not the live path.
- ``SimPool``: ``backends/pool.py::BackendPool`` itself, on the simulator's clock: health checks,
  ``/v1/loads`` aggregated by the pool (running and waiting summed, ``token_usage`` the maximum
  over ranks), circuit breakers; fed by the engines instead of HTTP.
- ``SimDriver``: ``gateway/request/dispatch.py::Dispatcher`` without the futures: it sends the core the
  same events (arrive, cancel, retry, requeue, wake, first token, release, tick, backends) and
  handles decisions the same way (a dispatch for a request whose client left is finished at once).
- ``Faults``: clients that leave (``cancel_rate``), backends that refuse connections for a while
  (``unhealthy``), team leases another replica holds (``lease_refusal_rate``).

``tests/loadtest/test_same_decisions.py`` feeds one event sequence through the live dispatcher and
through ``SimDriver`` and checks that they decide the same.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from backends.config import BackendConfig, HealthConfig, ModelConfig
from backends.pool import Backend, BackendPool
from backends.sim.engine import Engine
from backends.sim.tokenizer import BYTES_PER_TOKEN
from policies.core import DecisionCore
from policies.prefix import from_blocks, total_tokens
from policies.tokens import TokenEstimator
from policies.types import BackendView, Decision, Dispatch, Outcome, Refuse, RequestFacts

# ----- faults ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Faults:
    cancel_rate: float = 0.0
    """Share of requests whose client leaves, at a uniform time in ``[0, cancel_within_s)`` after sending."""
    cancel_within_s: float = 30.0
    unhealthy: tuple[tuple[str, float, float], ...] = ()
    """``(backend, start_s, end_s)``: the backend refuses connections (and drops its streams) in that
    window, and comes back with an empty cache."""
    lease_refusal_rate: float = 0.0
    """Share of dispatches whose team lease another replica holds (requeued, woken ``1 s`` later)."""

    @property
    def any(self) -> bool:
        return bool(self.cancel_rate or self.unhealthy or self.lease_refusal_rate)


def parse_unhealthy(text: str | None) -> tuple[tuple[str, float, float], ...]:
    """``NAME:START_S:END_S,...`` (e.g. ``b0:300:420``) → windows; a clear ValueError otherwise."""
    out = []
    for item in (text or "").split(","):
        if not item.strip():
            continue
        parts = item.strip().split(":")
        try:
            name, start, end = parts[0], float(parts[1]), float(parts[2])
        except (IndexError, ValueError):
            raise ValueError(f"--unhealthy {item!r}: expected NAME:START_S:END_S (e.g. b0:300:420)") from None
        if len(parts) != 3 or not name or not 0 <= start < end:
            raise ValueError(f"--unhealthy {item!r}: expected NAME:START_S:END_S with 0 <= START < END")
        out.append((name, start, end))
    return tuple(out)


# ----- facts -------------------------------------------------------------------------------------


class LiveFacts:
    """``RequestFacts`` as ``serve`` computes them (or, with ``oracle``, as only the simulator knows them).

    A workload block of ``n`` tokens is ``n · bytes_per_token`` bytes of rendered prompt (the twin's
    tokenizer: 4); its estimated tokens follow ``policies/prefix.py::fingerprint``'s rounding:
    ``round(end · r) − round(start · r)`` with ``r`` the estimator's ratio at arrival. The block keys
    stay the workload's (a chained hash of the prefix, as the live fingerprint's are).
    """

    def __init__(
        self,
        *,
        oracle: bool = False,
        max_tokens: int = 0,
        bytes_per_token: int = BYTES_PER_TOKEN,
        estimator: TokenEstimator | None = None,
    ) -> None:
        self.oracle = oracle
        self.max_tokens = max_tokens
        self.bytes_per_token = bytes_per_token
        self.estimator = estimator or TokenEstimator()

    def facts(
        self,
        rid: str,
        model: str,
        team: str,
        blocks: Sequence[tuple[int, int]],
        output_tokens: int,
        conversation: str | None,
    ) -> tuple[RequestFacts, int]:
        """The facts and the prompt's size in bytes (what ``observe`` learns the ratio from)."""
        if self.oracle:
            fp = from_blocks(blocks)
            prompt_bytes = total_tokens(fp) * self.bytes_per_token
            return RequestFacts(
                rid=rid,
                model=model,
                team=team,
                prompt_tokens=total_tokens(fp),
                max_output_tokens=output_tokens,
                fingerprint=fp,
                conversation=conversation,
            ), prompt_bytes
        r = self.estimator.ratio
        bpt = self.bytes_per_token
        out: list[tuple[int, int]] = []
        end = prev = 0
        for key, n in blocks:
            end += n * bpt
            tokens = round(end * r)
            out.append((key, max(1, tokens - prev)))
            prev = tokens
        fp = tuple(out)
        return RequestFacts(
            rid=rid,
            model=model,
            team=team,
            prompt_tokens=total_tokens(fp),
            max_output_tokens=self.max_tokens,
            fingerprint=fp,
        ), end

    def observe(self, prompt_bytes: int, prompt_tokens: int) -> None:
        """A completed request's reported usage (as ``gateway/request/lifecycle.py`` feeds it)."""
        self.estimator.observe(prompt_bytes, prompt_tokens)


# ----- the pool ----------------------------------------------------------------------------------


@dataclass
class _PoolConfig:
    """What ``BackendPool`` reads (``backends/config.py::PoolConfig``)."""

    models: Mapping[str, ModelConfig]
    health: HealthConfig
    breaker: Mapping[str, Any]

    def upstream_model(self, alias: str) -> str:
        return alias


class SimPool:
    """``BackendPool`` over simulated engines, on the simulator's clock."""

    def __init__(
        self,
        model: str,
        engines: Mapping[str, Any],
        clock: Callable[[], float],
        health: HealthConfig | None = None,
        breaker: Mapping[str, Any] | None = None,
        unhealthy: Iterable[tuple[str, float, float]] = (),
        blind: bool = False,
    ) -> None:
        """``blind``: the engines publish nothing (``--visibility blind``): each backend is ``engine:
        openai`` (no capacity, loads or DP ranks; a concurrency limit learned from time to first token,
        ``policies/adaptive_limit.py``), as in front of a hosted endpoint."""
        self.model = model
        self.engines = engines
        self.clock = clock
        self.blind = blind
        self._sent: dict[str, tuple[str, float, int]] = {}
        configs = [
            BackendConfig(url=f"http://sim/{name}", name=name, engine="openai")
            if blind
            else BackendConfig(
                url=f"http://sim/{name}", name=name, dp_size=max(1, int(e.dp_size)), engine=_engine_of(e)
            )
            for name, e in engines.items()
        ]
        self.health = health or HealthConfig()
        self.pool = BackendPool(
            _PoolConfig({model: ModelConfig(upstream_model=model, backends=configs)}, self.health, dict(breaker or {})),
            polled=False,
            clock=clock,
        )
        self.backends: dict[str, Backend] = {b.name: b for b in self.pool.models[model]}
        self.windows = list(unhealthy)
        unknown = {name for name, _, _ in self.windows} - set(engines)
        if unknown:
            raise ValueError(f"--unhealthy: no backend {', '.join(sorted(unknown))} (backends: {', '.join(engines)})")

    def down(self, name: str, now: float) -> bool:
        return any(n == name and start <= now < end for n, start, end in self.windows)

    def check_health(self, now: float) -> None:
        """One round of ``/health`` checks (the first passing one reads ``/get_server_info``)."""
        for name, b in self.backends.items():
            if self.down(name, now):
                self.pool.mark_failure(b, "ConnectError: connection refused")
                continue
            if not b.info_fetched:
                if not self.blind:
                    _read_server_info(b, self.engines[name])
                b.info_fetched = True
            self.pool.mark_ok(b)

    def poll_loads(self, now: float) -> None:
        """One round of ``/v1/loads`` polls of the healthy backends, aggregated by the pool."""
        if self.blind:
            return
        for name, b in self.backends.items():
            if b.healthy and not self.down(name, now):
                self.pool._apply_loads(b, {"loads": [_load_json(ld) for ld in self.engines[name].loads()]})

    def views(self) -> list[BackendView]:
        return self.pool.views(self.model)

    def sent(self, rid: str, name: str, now: float) -> None:
        """Blind: request ``rid`` went to ``name`` (the upstream hop's in-flight count)."""
        if self.blind:
            b = self.backends[name]
            b.inflight += 1
            self._sent[rid] = (name, now, b.inflight)

    def answered(self, rid: str, first_token: float | None, prompt_tokens: int, cached_tokens: int) -> None:
        """Blind: ``rid`` ended (``first_token`` None: without an answer); a streamed answer's time to
        first token goes to the backend's limiter, as ``gateway/request/upstream.py`` gives it live."""
        entry = self._sent.pop(rid, None)
        if entry is None:
            return
        name, at, inflight = entry
        b = self.backends[name]
        b.inflight -= 1
        if first_token is not None:
            self.pool.observe_latency(b, first_token - at, prompt_tokens, cached_tokens, inflight)

    def request_failed(self, name: str, kind: str) -> None:
        self.pool.request_failed(self.backends[name], kind, kind)

    def request_ok(self, name: str) -> None:
        self.pool.request_ok(self.backends[name])


def _engine_of(engine: Any) -> Literal["sglang", "vllm"]:
    """The engine a simulated server stands for: vLLM for a profile's vLLM variant (its eviction), else SGLang."""
    return "vllm" if isinstance(engine, Engine) and engine.profile.eviction == "lrf" else "sglang"


def _read_server_info(b: Backend, engine: Any) -> None:
    """What ``BackendPool`` reads from ``/get_server_info`` (SGLang): the token pool, and for a simulated
    engine (not an unbounded one) its running cap and host tier, which admission sizes seats with. From a
    vLLM server (``vllm:cache_config_info``) only the token pool: vLLM publishes neither of the others."""
    b.max_total_num_tokens = int(engine.max_total_num_tokens)
    if isinstance(engine, Engine) and not engine.unbounded and _engine_of(engine) == "sglang":
        p = engine.profile
        b.max_running_requests = int(p.max_running_requests)
        b.host_tokens = int(p.host_tier_tokens)
        b.reload_tokens_per_s = float(p.host_load_tokens_per_s)


def _load_json(ld: Any) -> dict[str, Any]:
    """One rank's entry of ``/v1/loads`` (the twin's fields)."""
    entry = dataclasses.asdict(ld)
    entry.pop("extra", None)
    return entry


# ----- the driver --------------------------------------------------------------------------------


class SimDriver:
    """``gateway/request/dispatch.py::Dispatcher`` for the simulator: the same events to the core, the same
    handling of its decisions, callbacks instead of futures.

    ``on_decision(decision, now)`` hears every decision for a request still waiting (a dispatch it will
    use, or a refusal), as the dispatcher's futures do; ``schedule(t, fn)`` runs ``fn(t)`` later (a
    requeued request's wake-up). With ``lease_refusal_rate`` > 0 and a core that keeps team limits,
    that share of dispatches find the team's lease held elsewhere: the request is requeued and its
    team woken a second later (a release somewhere else), as with Redis.
    """

    def __init__(
        self,
        core: DecisionCore,
        on_decision: Callable[[Decision, float], None],
        schedule: Callable[[float, Callable[[float], None]], None] | None = None,
        lease_refusal_rate: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.core = core
        self.on_decision = on_decision
        self.schedule = schedule
        self.lease_refusal_rate = lease_refusal_rate if "team" in core.hooks else 0.0
        self._rng = random.Random(seed)
        self._waiting: dict[str, RequestFacts] = {}
        self.requeues = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def set_backends(self, model: str, views: Sequence[BackendView], now: float) -> None:
        self._apply(self.core.set_backends(model, views, now), now)

    def arrive(self, facts: RequestFacts, now: float) -> None:
        self._waiting[facts.rid] = facts
        self._apply(self.core.arrive(facts, now), now)

    def cancel(self, rid: str, now: float) -> bool:
        """The client left while waiting (True), or after its dispatch (False: release it)."""
        if self._waiting.pop(rid, None) is not None:
            self._apply(self.core.cancel(rid, now), now)
            return True
        return False

    def retry(self, rid: str, failed_backend: str, now: float) -> Dispatch | Refuse:
        decisions = self.core.retry(rid, failed_backend, now)
        mine = next((d for d in decisions if d.rid == rid), None)
        self._apply([d for d in decisions if d.rid != rid], now)
        if mine is None:
            mine = Refuse(rid, "no_healthy_backend", "no other healthy backend to retry on", 5.0, 503)
        else:
            self.on_decision(mine, now)
        return mine

    def first_token(self, rid: str, now: float) -> None:
        self._apply(self.core.first_token(rid, now), now)

    def release(self, rid: str, outcome: Outcome, now: float) -> None:
        self._apply(self.core.finish(rid, outcome, now), now)

    def tick(self, now: float) -> None:
        if self._waiting:
            self._apply(self.core.tick(now), now)

    def wake(self, team: str, now: float) -> None:
        self._apply(self.core.wake(team, now), now)

    def set_share(self, share: float, split: bool, now: float) -> None:
        self._apply(self.core.set_share(share, split, now), now)

    def _wake_at(self, team: str, now: float) -> None:
        self.wake(team, now)

    def _apply(self, decisions: Iterable[Decision], now: float) -> None:
        for decision in decisions:
            facts = self._waiting.pop(decision.rid, None)
            if facts is None:
                if isinstance(decision, Dispatch):  # its client already left
                    self._apply(self.core.finish(decision.rid, Outcome(ok=False, reached_backend=False), now), now)
                continue
            if (
                isinstance(decision, Dispatch)
                and self.lease_refusal_rate
                and self._rng.random() < self.lease_refusal_rate
            ):
                self.requeues += 1
                self._waiting[decision.rid] = facts
                self._apply(self.core.requeue(decision.rid, now), now)
                if self.schedule is not None:
                    self.schedule(now + 1.0, functools.partial(self._wake_at, facts.team))
                continue
            self.on_decision(decision, now)

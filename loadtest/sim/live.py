"""The simulator's live-path plumbing (``loadtest/sim/simulate.py`` calls it): how a dispatch meets a
backend that refuses connections (one retry elsewhere, as ``gateway/request/upstream.py`` does), clients
that leave, backends that go away and come back empty; and the core built from a config file
validated as ``serve`` validates it. The driver and pool these use: ``loadtest/sim/driver.py``.
"""

from __future__ import annotations

import functools
import random
from collections import deque
from pathlib import Path
from typing import Any

from backends.sim.engine import Engine
from loadtest.sim.driver import LiveFacts, SimDriver, SimPool
from policies.core import DecisionCore
from policies.types import Decision, Dispatch, Outcome, Refuse


class LivePath:
    """Methods of ``Simulator`` (a mixin: they use its engines, pool, driver, queue and pending requests)."""

    engines: dict[str, Any]
    pending: dict[str, Any]
    records: list[Any]
    cfg: Any
    core: DecisionCore
    warm: float
    end: float

    def _live_path(self, model: str, settings: Any) -> None:
        """Set up the live path around the core; ``settings``: a validated gateway ``Config`` or None."""
        cfg = self.cfg
        self.now = 0.0
        self.facts = LiveFacts(oracle=cfg.oracle, max_tokens=cfg.max_tokens)
        self.pool = SimPool(
            model,
            self.engines,
            lambda: self.now,
            settings.health if settings is not None else None,
            settings.breaker if settings is not None else None,
            cfg.faults.unhealthy,
            blind=cfg.visibility == "blind",
        )
        self._decided: deque[Decision] = deque()
        self.driver = SimDriver(
            self.core,
            lambda d, _now: self._decided.append(d),
            lambda t, fn: self._push(t, self._CALL, fn),
            cfg.faults.lease_refusal_rate,
            cfg.seed,
        )
        self.pool.pool.subscribe(lambda alias, views: self.driver.set_backends(alias, views, self.now))
        self._faults = random.Random(cfg.seed * 7919 + 1)
        for name, start, end in cfg.faults.unhealthy:
            self._push(start, self._CALL, functools.partial(self._backend_down, name))
            self._push(end, self._CALL, functools.partial(self._backend_back, name))

    def _touch_backend(self, name: str) -> None:
        """Engine ``name`` changed (advanced, a request submitted or aborted, its cache flushed): the
        simulator re-queues the end of its next pass (``Simulator`` keeps that queue)."""
        raise NotImplementedError

    def fault_counts(self) -> dict[str, int]:
        """Requests in the measured window that a fault ended, and the dispatches requeued."""
        done = [r for r in self.records if self.warm <= r.arrival < self.end]
        return {
            "cancelled": sum(r.error == "cancelled" for r in done),
            "stream_broken": sum(r.error == "stream_broken" for r in done),
            "connect_failed": sum(r.error == "connect" for r in done),
            "requeues": self.driver.requeues,
        }

    def _health(self, now: float) -> None:
        self.pool.check_health(now)
        self._push(now + self.pool.health.interval_s, self._CALL, self._health)

    def _dispatch(self, p: Any, d: Dispatch, now: float) -> None:
        if self.pool.down(d.backend, now):  # connection refused: nothing reached it; one retry elsewhere
            self.pool.request_failed(d.backend, "connect")
            if p.retried:
                self._failed(p, "connect", now, reached=False)
                return
            p.retried = True
            retry = self.driver.retry(p.record.rid, d.backend, now)  # the core's answer is queued already
            if isinstance(retry, Refuse):
                self.driver.release(p.record.rid, Outcome(ok=False, reached_backend=False), now)
                if not any(q is retry for q in self._decided):  # the driver's own "nowhere to retry"
                    self._decided.appendleft(retry)
            return
        engine = self.engines[d.backend]
        self._decided.extend(self._on_engine_events(engine.advance(now), now, apply=False))
        p.record.backend = p.backend = d.backend
        context = engine.profile.context_length if isinstance(engine, Engine) else None  # a test's stand-in: none
        engine.submit(_engine_request(d.rid, p, d.rank, context), now)
        self.pool.sent(d.rid, d.backend, now)
        self._touch_backend(d.backend)

    def _failed(self, p: Any, error: str, now: float, *, reached: bool) -> None:
        """The request ended without an answer (its client left, its backend went away): the core
        hears it as the gateway would, and a closed-loop client resends the turn a second later."""
        self.pool.answered(p.record.rid, None, 0, 0)
        self.driver.release(p.record.rid, Outcome(ok=False, reached_backend=reached), now)
        self._refused(p, Refuse(p.record.rid, "no_healthy_backend", error, 1.0), now)
        p.record.error = error

    def _client_left(self, rid: str, now: float) -> None:
        p = self.pending.get(rid)
        if p is None:
            return
        if self.driver.cancel(rid, now):  # still waiting: the core forgets it
            self._refused(p, Refuse(rid, "no_healthy_backend", "cancelled", 1.0), now)
            p.record.error = "cancelled"
            return
        if p.backend is not None:
            self._decided.extend(self._on_engine_events(self.engines[p.backend].advance(now), now, apply=False))
            if rid not in self.pending:  # it finished in that instant
                self._touch_backend(p.backend)
                return
            self.engines[p.backend].abort(rid, now)
            self._touch_backend(p.backend)
        self._failed(p, "cancelled", now, reached=p.backend is not None)

    def _backend_down(self, name: str, now: float) -> None:
        """Streams on ``name`` break; new connections are refused until it is back."""
        engine = self.engines[name]
        self._decided.extend(self._on_engine_events(engine.advance(now), now, apply=False))
        for rid, p in list(self.pending.items()):
            if p.backend == name:
                engine.abort(rid, now)
                self.pool.request_failed(name, "stream_broken")
                self._failed(p, "stream_broken", now, reached=True)
        self._touch_backend(name)

    def _backend_back(self, name: str, now: float) -> None:
        self.engines[name].flush_cache()  # a restarted engine starts with an empty cache
        self._touch_backend(name)


def _engine_request(rid: str, p: Any, rank: int | None, context_length: int | None) -> Any:
    """The workload's clients send no ``max_tokens``: SGLang (and the twin's planner) then budget the
    answer at the context left after the prompt, which is what the engine's admission reserves from."""
    from backends.sim.engine import EngineRequest

    request = EngineRequest(
        rid=rid,
        prompt=p.prompt,
        output_tokens=p.output_tokens,
        max_new_tokens=p.output_tokens,
        final_blocks=p.final_blocks,
        dp_rank=rank,
    )
    if context_length is not None:
        request.max_new_tokens = max(p.output_tokens, context_length - request.prompt_tokens)
    return request


def build_core(
    policy: str, admission: str | None = None, routing: str | None = None, config: dict | None = None
) -> DecisionCore:
    """The decision core for ``--policy`` with optional ``--admission`` / ``--routing`` overrides.

    ``config`` (the ``--config`` file's content) is validated as ``serve`` validates its file
    (``gateway/config/schema.py::Config``); its ``router:`` parameters build the router, and its teams and
    ``admission:`` go to ``core.configure`` as ``serve`` sends them, except that only the teams the file
    lists are configured (a team it does not list has no limit beyond its own conversations).
    """
    from policies import registry

    settings = validate_config(config) if config is not None else None
    core = registry.build(
        policy, routing=routing, admission=admission, router_params=settings.router if settings is not None else None
    )
    if settings is not None and config is not None:
        listed = set(config.get("teams") or ())
        core.configure(
            {
                "teams": {n: t.model_dump() for n, t in settings.teams.items() if n in listed},
                "admission": settings.admission,
            }
        )
    return core


def validate_config(config: dict) -> Any:
    """``config`` checked by the gateway's own models (a ValueError naming the bad field)."""
    from gateway.config.schema import Config

    return Config.model_validate(config)


def _load_config(path: Path | None) -> dict | None:
    if path is None:
        return None
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping (the shape of deploy/cachegate.example.yaml)")
    return data

"""Hypothesis property tests over random request sequences (engine model)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.sim.engine import STUCK_MESSAGE, Engine, EngineRequest
from backends.sim.profiles import get_profile

# A request: (arrival gap, shared prefix id or -1, prefix blocks, own blocks, block size, output, abort after)
_req = st.tuples(
    st.floats(0.0, 0.5),
    st.integers(-1, 2),
    st.integers(0, 12),
    st.integers(0, 12),
    st.sampled_from([16, 64, 100, 256]),
    st.integers(1, 300),
    st.one_of(st.none(), st.floats(0.0, 1.0)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=st.lists(_req, min_size=1, max_size=25),
    kv=st.integers(1500, 12000),
    dp=st.sampled_from([1, 1, 3]),
    host=st.sampled_from([0, 0, 3000]),
    lpm=st.booleans(),
)
def test_random_sequences_keep_the_pool_consistent(reqs: list[tuple], kv: int, dp: int, host: int, lpm: bool) -> None:
    p = get_profile("tiny").with_(
        dp_size=dp,
        host_tier_tokens=host,
        host_load_tokens_per_s=1e6,
        chunked_prefill_size=512,
        max_prefill_tokens=1024,
        schedule_policy="lpm" if lpm else "fcfs",
    )
    e = Engine(p, kv_tokens=kv)
    ended: dict[str, int] = {}
    aborted: set[str] = set()
    prompts: dict[str, int] = {}
    aborts: list[tuple[float, str]] = []
    now = 0.0
    for i, (gap, shared, nshared, nown, bs, out, abort_after) in enumerate(reqs):
        now += gap
        for ev in e.advance(now):
            assert ev.cached_tokens <= prompts[ev.rid]
            assert ev.message != STUCK_MESSAGE, f"{ev.rid} could never be admitted"
            if ev.kind == "finished":
                ended[ev.rid] = ended.get(ev.rid, 0) + 1
        e.check_invariants()
        for _t, rid in [a for a in aborts if a[0] <= now]:
            if e.abort(rid, now):
                aborted.add(rid)
        aborts = [a for a in aborts if a[0] > now]
        prefix = [(1_000_000 * (shared + 2) + k, bs) for k in range(nshared)] if shared >= 0 else []
        own = [(10_000_000 + 1000 * i + k, bs) for k in range(nown)]
        rid = f"r{i}"
        prompts[rid] = sum(n for _, n in prefix + own)
        e.submit(EngineRequest(rid, prefix + own, out, max(out, 128)), now)
        if abort_after is not None:
            aborts.append((now + abort_after, rid))
        for ld in e.loads():
            assert 0 <= ld.num_used_tokens <= ld.max_total_num_tokens
    guard = 0
    while not e.idle():
        t = e.next_time()
        assert t is not None and t >= now
        now = t
        for ev in e.complete():
            assert ev.cached_tokens <= prompts[ev.rid]
            assert ev.message != STUCK_MESSAGE, f"{ev.rid} could never be admitted"
            if ev.kind == "finished":
                ended[ev.rid] = ended.get(ev.rid, 0) + 1
        e.check_invariants()
        guard += 1
        assert guard < 200_000, "engine does not make progress"
    # every request ends exactly once: a finished event, or our abort
    for rid in prompts:
        assert ended.get(rid, 0) + (rid in aborted) == 1, rid
    for ld in e.loads():
        assert ld.num_used_tokens == 0 and ld.num_running_reqs == 0 and ld.num_waiting_reqs == 0

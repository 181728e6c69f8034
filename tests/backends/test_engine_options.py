"""Engine options: DP defaults, FP8 / context-parallel prefill attention, kv_b_proj
re-expansion, decode context parallelism, speculative decoding, mixed chunk, prefill delayer,
per-request overhead."""

from __future__ import annotations

import pytest

from backends.sim import profiles
from backends.sim.engine import Engine, EngineRequest
from backends.sim.profile_constants import DCP_COLLECTIVE_S
from backends.sim.profiles import get_profile
from tests.backends.sim.test_engine import blocks, by_kind, run


def first_token(e: Engine, rid: str, events: list) -> float:
    return by_kind(events, "first_token")[rid].time


def test_cp_profile_is_the_dp_profile_with_fp8_cp_attention_and_says_what_is_fitted() -> None:
    dp, cp = get_profile("b300-dp8-fp8"), get_profile("b300-dp8-fp8-cp")
    fit = profiles.GOOD_FIT
    # FP8 doubles the peak, CP8 spreads a rank's attention over 8 GPUs, at the fitted utilisation
    assert cp.k_attn == pytest.approx(dp.k_attn * profiles.U_ATTN / fit.u_attn / 2 / 8)
    assert (
        cp.k_kvb / cp.k_attn
        == pytest.approx(dp.k_kvb / dp.k_attn)
        == pytest.approx(profiles.KVB_FLOPS / profiles.ATTN_FLOPS)
    )
    assert (cp.chunked_prefill_size, cp.init_new_token_ratio) == (dp.chunked_prefill_size, dp.init_new_token_ratio)
    assert cp.max_running_requests == fit.max_running_total // 8
    assert (cp.kv_tokens, cp.k_kv, cp.a, cp.t_experts) == (dp.kv_tokens, dp.k_kv, dp.a, dp.t_experts)
    assert "U_ATTN" in cp.fitted and "FITTED" in cp.doc
    # b300-tp4-fp8 borrows only the fitted front end (tests/backends/test_engine_replicas.py)
    assert all(not p.fitted for n, p in profiles.PROFILES.items() if n not in ("b300-dp8-fp8-cp", "b300-tp4-fp8"))


def test_kv_b_proj_re_expansion_costs_each_chunk_its_prefix() -> None:
    p = get_profile("b300-dp8-fp8")
    without = p.with_(k_kvb=0.0)
    u = 3 * p.chunked_prefill_size
    extra = p.solo_prefill_s(u, 100_000) - without.solo_prefill_s(u, 100_000)
    prefixes = [100_000 + i * p.chunked_prefill_size for i in range(3)]
    assert extra == pytest.approx(p.k_kvb * sum(prefixes))
    # +20 % of the attention at 2048-token chunks (the review's figure)
    assert p.k_kvb * 1 / (p.k_attn * p.chunked_prefill_size) == pytest.approx(0.1997, rel=0.01)


def test_context_parallel_ranks_prefilling_together_share_the_gpus() -> None:
    """Under CP two ranks' attention in one pass runs one after the other; without CP side by side."""

    def pass_time(cp: int, ranks: int) -> float:
        p = get_profile("b300-dp8-fp8").with_(prefill_cp_size=cp)
        e = Engine(p)
        e.submit(EngineRequest("busy", blocks(2048), 1, 1, dp_rank=7), 0.0)  # the next pass batches the rest
        for r in range(ranks):
            e.submit(EngineRequest(f"q{r}", blocks(2048), 1, 1, dp_rank=r), 0.0)
        ev = by_kind(run(e), "first_token")
        return max(ev[f"q{r}"].time for r in range(ranks)) - ev["busy"].time

    assert pass_time(1, 2) == pytest.approx(pass_time(1, 1))
    p = get_profile("b300-dp8-fp8")
    attn = p.k_attn * 2048 * 1024
    assert pass_time(8, 2) == pytest.approx(pass_time(8, 1) + attn)


def test_speculative_decoding_changes_the_step_as_derived() -> None:
    base = get_profile("b300-tp8-fp8")
    spec = base.with_(spec_draft_tokens=2, spec_accept_length=2.0)

    def decode_s(p: profiles.Profile) -> float:
        e = Engine(p)
        e.submit(EngineRequest("solo", blocks(10_000, 512), 3, 3), 0.0)
        ev = run(e)
        return by_kind(ev, "finished")["solo"].time - by_kind(ev, "first_token")["solo"].time

    cov = 1 - (1 - 8 / 384) ** 3
    step1 = (base.a * 1.2 + base.t_experts * cov + base.b * 3 + base.k_kv * 10_001 * 1.1) / 2.0
    step2 = step1 + base.k_kv * 1.1 / 2.0
    assert decode_s(spec) == pytest.approx(step1 + step2, rel=1e-9)
    assert decode_s(spec) < decode_s(base)


def test_mixed_chunk_lets_decodes_ride_along() -> None:
    def finish(mixed: bool) -> float:
        e = Engine(get_profile("b300-tp8-fp8").with_(mixed_chunk=mixed))
        e.submit(EngineRequest("dec", blocks(1000), 20, 20), 0.0)
        run(e, 0.1)
        e.submit(EngineRequest("pf", blocks(100_000), 1, 1), 0.1)
        return by_kind(run(e), "finished")["dec"].time

    # 7 prefill chunks of 16k, each carrying one decode step: ~7 steps of ~7 ms saved
    assert finish(True) < finish(False) - 0.03


def test_prefill_delayer_holds_one_ranks_prefill_while_others_decode() -> None:
    def first(delay: int) -> float:
        e = Engine(get_profile("b300-dp8-fp8").with_(prefill_delayer_max_passes=delay))
        e.submit(EngineRequest("dec", blocks(1000), 200, 200, dp_rank=0), 0.0)
        run(e, 0.5)
        e.submit(EngineRequest("pf", blocks(1000), 1, 1, dp_rank=1), 0.5)
        return by_kind(run(e), "first_token")["pf"].time

    off, on = first(0), first(30)
    assert on > off + 10 * 0.02  # held for up to 30 decode passes of ~25 ms
    assert on < off + 5.0  # and never past max_delay


def test_per_request_overhead_delays_the_scheduler() -> None:
    p = get_profile("b300-dp8-fp8-cp")
    assert p.overhead_s(150_000) == pytest.approx(p.request_overhead_s + 150_000 / p.tokenize_tokens_per_s)
    e = Engine(p)
    e.submit(EngineRequest("x", blocks(20_000), 1, 1, dp_rank=0), 0.0)
    ev = run(e)
    assert first_token(e, "x", ev) == pytest.approx(p.solo_prefill_s(20_000, 0), rel=1e-9)
    e2 = Engine(p)
    e2.submit(EngineRequest("y", blocks(20_000), 1, 1, dp_rank=0), 0.0)
    assert e2.abort("y", 0.01) and not e2.is_live("y")
    assert [x for x in run(e2) if x.rid == "y"] == []
    assert e2.idle()


def test_gb10_single_request_speeds_are_near_the_post() -> None:
    from loadtest.analysis.single import single_request

    p = get_profile("gb10x16-tp16-fp8")
    prefill, _ = single_request(p, 8192)
    _, decode_long = single_request(p, 131072)
    _, decode_short = single_request(p, 2048)
    assert prefill == pytest.approx(750, rel=0.25)
    assert decode_long == pytest.approx(20, rel=0.25)
    assert decode_short == pytest.approx(38, rel=0.25)


def test_decode_context_parallelism_shards_the_kv_and_pays_its_collectives() -> None:
    tp, dcp = get_profile("b300-tp8-fp8"), get_profile("b300-tp8-fp8-dcp8")
    assert dcp.dcp_size == 8 and not dcp.fitted
    assert dcp.kv_tokens == 8 * tp.kv_tokens  # rows per GPU × dcp_size
    assert dcp.k_kv == pytest.approx(tp.k_kv / 8)  # each GPU reads its shard of every context
    assert (dcp.k_attn, dcp.r_lin, dcp.t_experts) == (tp.k_attn, tp.r_lin, tp.t_experts)  # prefill compute as TP8
    assert dcp.a - tp.a == pytest.approx(2 * 61 * DCP_COLLECTIVE_S)
    assert dcp.b > tp.b and dcp.k_kvb > tp.k_kvb  # the partial outputs' bytes; the prefix gathered per chunk
    assert dcp.chunked_prefill_size == tp.chunked_prefill_size == 16384  # not a DP setting: no // dp_size

    def served(p: profiles.Profile, n: int, out: int) -> tuple[int, float]:
        """n contexts of 150k tokens at once: the most running together, and how long the decode phase lasts
        (the last first token to the last finish: prefill runs first, so that is every request decoding)."""
        e = Engine(p)
        for i in range(n):
            e.submit(EngineRequest(f"r{i}", blocks(150_000, 16384), out, out), 0.0)
        peak, t, events = 0, 0.0, []
        while not e.idle():
            t += 1.0
            events += run(e, t)
            peak = max(peak, e.loads()[0].num_running_reqs)
        first = max(ev.time for ev in events if ev.kind == "first_token")
        return peak, max(ev.time for ev in events if ev.kind == "finished") - first

    assert served(tp, 48, 2)[0] < 36 and served(dcp, 48, 2)[0] == 48  # 5.26M tokens hold 35 of them; 42M all
    # 30 fit either pool: the same batch decodes in under 0.6 of the time (25 ms of KV reads per step become 3)
    assert served(dcp, 30, 50)[1] < 0.6 * served(tp, 30, 50)[1]

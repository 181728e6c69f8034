"""``backends/sim/profile_dcp.py``: what decode context parallelism (``--dcp-size``) adds to a TP profile:
two collectives per layer per step, each request's query heads and partial outputs over NVLink, and the
cached prefix gathered in bf16 per chunk; all but the collectives scale with the share received."""

from __future__ import annotations

import pytest

from backends.sim.profile_constants import DCP_COLLECTIVE_S, LATENT_ELEMS, LAYERS, NVLINK_BW, U_BW
from backends.sim.profile_dcp import HEADS, OUT_DIM, Q_DIM, DcpCost


def test_the_cost_of_dcp8_term_by_term() -> None:
    cost = DcpCost.of(8)
    nvl = NVLINK_BW * U_BW
    assert cost.dcp == 8
    assert cost.a == pytest.approx(2 * 61 * 10e-6) == 2 * LAYERS * DCP_COLLECTIVE_S
    assert cost.b == pytest.approx(LAYERS * HEADS * (7 / 8) * (Q_DIM + OUT_DIM) * 2 / nvl)
    assert cost.k_kvb == pytest.approx(LATENT_ELEMS * 2 * (7 / 8) / nvl)
    assert (Q_DIM, OUT_DIM, HEADS) == (576, 512, 64)


def test_the_traffic_grows_with_the_share_received_and_the_collectives_do_not() -> None:
    two, eight = DcpCost.of(2), DcpCost.of(8)
    assert two.a == eight.a
    assert eight.b / two.b == pytest.approx((7 / 8) / (1 / 2))
    assert eight.k_kvb / two.k_kvb == pytest.approx((7 / 8) / (1 / 2))
    alone = DcpCost.of(1)
    assert (alone.b, alone.k_kvb) == (0.0, 0.0)  # nothing received from other ranks


def test_the_derivation_lines_state_the_totals_they_are_given() -> None:
    lines = DcpCost.of(8).doc(a=0.0112, b=9.5e-5, k_kv=1.3e-9, k_kvb=4.2e-8)
    text = "\n".join(lines)
    assert len(lines) == 4 and "--dcp-size 8" in lines[0]
    assert "k_kv / 8 = 1.30 ns" in text and "= 11.20 ms per step" in text and "= 95.0 µs per request" in text
    assert "7/8" in text and "= 4.2e-08 s per cached-prefix token" in text

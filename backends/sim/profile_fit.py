"""The constants of the one fitted profile (``b300-dp8-fp8-cp``): the one place the "derive, never fit"
rule is broken, on purpose. ``python -m loadtest.analysis.fit_good`` fits them to the published good deployment
(reference §11) and prints the residuals, which ``docs/calibration.md`` holds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fit:
    """Constants of the one fitted profile (``b300-dp8-fp8-cp``), from ``loadtest/analysis/fit_good.py``."""

    u_attn: float
    u_lin: float
    max_running_total: int
    tokenize_tokens_per_s: float
    request_overhead_s: float
    spec_draft_tokens: int = 0
    spec_accept_length: float = 1.0


GOOD_FIT = Fit(
    u_attn=0.6,
    u_lin=0.45,
    max_running_total=40,
    tokenize_tokens_per_s=1.0e6,
    request_overhead_s=0.05,
    spec_draft_tokens=1,
    spec_accept_length=1.3,
)

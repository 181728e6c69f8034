"""Single-request speed of a profile on an idle engine: prefill tokens/s of a cold prompt and
decode tokens/s at a given context (the GB10 calibration against the 16×GB10 post).

    python -m loadtest.analysis.single --profiles gb10x16-tp16-fp8,gb10x16-tp4pp4-fp8

Virtual time: the figures are exact. Prefill = prompt / time to first token (overhead included);
decode = (output − 1) / (finish − first token).
"""

from __future__ import annotations

import argparse
import itertools

from backends.sim.engine import Engine, EngineRequest
from backends.sim.profiles import Profile, get_profile

PROMPTS = (2048, 8192, 32768, 131072)
_keys = itertools.count(1)


def _blocks(ntok: int, size: int = 512) -> list[tuple[int, int]]:
    out = []
    while ntok > 0:
        n = min(size, ntok)
        out.append((next(_keys), n))
        ntok -= n
    return out


def single_request(profile: Profile, prompt: int, output: int = 64) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) of one request alone on ``profile``."""
    e = Engine(profile)
    e.submit(EngineRequest("solo", _blocks(prompt), output, output), 0.0)
    events = e.advance(float("inf"))
    first = next(ev.time for ev in events if ev.kind == "first_token")
    done = next(ev.time for ev in events if ev.kind == "finished")
    return prompt / first, (output - 1) / (done - first)


def pp_bounds(profile: Profile, context: int) -> tuple[float, float, float]:
    """Decode tokens/s of one request at ``context`` on a GB10 layout, three ways: the LPDDR5x
    floor (every byte the token needs, 100 % of 273 GB/s, no overhead), the same at the profiles'
    ``U_BW``, and the engine model (with the per-stage launches and all-reduces). One request
    crosses the ``pp`` stages one after another, so each node reads its share of the non-expert
    weights, of the 8 activated experts and of the whole latent per stage: bytes per token
    ``W_dense / tp + W_experts · 8/384 / tp + 35,136 · context`` over one node's bandwidth."""
    from backends.sim.profile_constants import GB10_BW, LATENT_ELEMS, U_BW, W_EXPERTS, W_TOTAL

    cov1 = profile.experts_per_token / profile.num_experts
    tp = profile.tp_size
    nbytes = (W_TOTAL - W_EXPERTS) / tp + W_EXPERTS * cov1 / tp + LATENT_ELEMS * context
    return GB10_BW / nbytes, GB10_BW * U_BW / nbytes, single_request(profile, context)[1]


def batch_decode(profile: Profile, batch: int, context: int) -> tuple[float, float]:
    """(per-request, aggregate) decode tokens/s with ``batch`` requests of ``context`` tokens all
    decoding: the engine's step formula (micro-batches overlap across stages once batch >= pp)."""
    per_stage = max(batch / profile.pp, 1.0)
    cov = 1.0 - (1.0 - profile.experts_per_token / profile.num_experts) ** per_stage
    kv = profile.k_kv * batch * context * profile.pp / min(batch, profile.pp)
    step = profile.a + profile.t_experts * cov + profile.b * min(batch, profile.b_cap) + kv
    return 1 / step, batch / step


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", default="gb10x16-tp16-fp8,gb10x16-tp4pp4-fp8")
    args = ap.parse_args(argv)
    print(
        "| Profile | Prefill tok/s ("
        + " / ".join(f"{p // 1024}k" for p in PROMPTS)
        + ") | Decode tok/s ("
        + " / ".join(f"{p // 1024}k" for p in PROMPTS)
        + ") |"
    )
    print("|---|---|---|")
    for name in args.profiles.split(","):
        p = get_profile(name)
        rows = [single_request(p, n) for n in PROMPTS]
        print(
            f"| `{name}` | "
            + " / ".join(f"{r[0]:,.0f}" for r in rows)
            + " | "
            + " / ".join(f"{r[1]:.1f}" for r in rows)
            + " |"
        )


if __name__ == "__main__":
    main()

"""The time-to-first-token floor of a workload on an engine profile: every turn's own prefill, alone
on an idle rank, with a perfect cache (everything sent or generated before in its conversation, and
the shared system prompt, is cached; only the turn's new tokens are computed).

No router or admission policy can give a turn a smaller TTFT, so if fewer than half of the turns fit
under a target, no policy reaches that median. Virtual time: the figures are exact.

    .venv/bin/python -m loadtest.analysis.ttft_floor --profiles b300-dp8-fp8,b300-tp8-fp8 --conversations 48
    .venv/bin/python -m loadtest.analysis.ttft_floor --profiles b300-dp8-fp8 --attn-utilisation 0.4,0.6,1.0 \
        --simulate gateway

``--attn-utilisation`` asks "what if prefill attention ran at this fraction of peak FLOP/s instead
of the profiles' ``U_ATTN``": it rescales ``k_attn`` of a copy, never the registered profiles.
``--simulate POLICY`` adds what that policy reaches on the same (possibly what-if) engine in a
``cachegate simulate`` run of ``--conversations`` (20 minutes, 5 of warm-up, same seed).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

from backends.sim.engine import Engine
from backends.sim.profiles import GOOD_FIT, U_ATTN, Profile, get_profile
from loadtest.results.metrics import percentile
from loadtest.sim.simulate import SimConfig, run_one
from loadtest.workloads.core import CodingAgent


def turn_sizes(conversations: int, *, per_slot: int = 2, seed: int = 1) -> Iterator[tuple[int, int]]:
    """``(u, c)`` of every turn of the first ``per_slot`` conversations of each slot: ``u`` new
    tokens on top of ``c`` cached ones. The last token of the previous answer is never cached (an
    engine holds no KV for a request's last token), so it counts as new."""
    agent = CodingAgent(seed=seed)
    for slot in range(conversations):
        for index in range(per_slot):
            conv = agent.conversation(slot, index)
            history = 0
            for n, turn in enumerate(conv.turns):
                new = sum(seg.tokens for seg in turn.new)
                if n == 0:
                    shared = turn.new[0].tokens  # the assistant's system prompt + tools
                    yield new - shared, shared
                else:
                    yield new + 1, history - 1
                history += new + turn.output_tokens


def at_attn_utilisation(profile: Profile, utilisation: float) -> Profile:
    """``profile`` with prefill attention (and its ``kv_b_proj`` re-expansion) at ``utilisation`` of
    peak instead of the profile's own (``U_ATTN``, or the fitted one of ``b300-dp8-fp8-cp``)."""
    base = GOOD_FIT.u_attn if "U_ATTN" in profile.fitted else U_ATTN
    return profile.with_(
        name=f"{profile.name} @ U_ATTN {utilisation:g}",
        k_attn=profile.k_attn * base / utilisation,
        k_kvb=profile.k_kvb * base / utilisation,
    )


def floor_row(profile: Profile, conversations: int, *, target_s: float = 1.0, seed: int = 1) -> dict:
    times = [profile.solo_prefill_s(u, c) for u, c in turn_sizes(conversations, seed=seed)]
    return {
        "profile": profile.name,
        "conversations": conversations,
        "seed": seed,
        "turns": len(times),
        "floor_p25_s": round(percentile(times, 25) or 0.0, 3),
        "floor_p50_s": round(percentile(times, 50) or 0.0, 3),
        "floor_p75_s": round(percentile(times, 75) or 0.0, 3),
        "target_s": target_s,
        "share_within_target": round(sum(t <= target_s for t in times) / len(times), 3),
    }


def simulated_p50(profile: Profile, registered: str, policy: str, conversations: int, seed: int) -> float | None:
    """Median TTFT of ``policy`` on engines built from ``profile`` (``registered``: its base name)."""
    cfg = SimConfig(profile=registered, policy=policy, conversations=conversations, seed=seed)
    return run_one(cfg, engine_factory=lambda: Engine(profile))["ttft_p50_s"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", default="b300-dp8-fp8,b300-tp8-fp8")
    ap.add_argument("--conversations", type=int, default=48)
    ap.add_argument("--target", type=float, default=1.0, help="TTFT target in seconds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--attn-utilisation",
        default="",
        help=f"comma-separated what-if fractions of peak for prefill attention (profiles: {U_ATTN})",
    )
    ap.add_argument(
        "--simulate",
        metavar="POLICY",
        default="",
        help="also simulate POLICY (e.g. gateway) on each profile and report its median TTFT",
    )
    ap.add_argument("--json", action="store_true", help="one JSON object a line instead of a table")
    args = ap.parse_args(argv)
    profiles = [(name, get_profile(name)) for name in args.profiles.split(",")]
    if args.attn_utilisation:
        profiles = [
            (name, at_attn_utilisation(p, float(u))) for name, p in profiles for u in args.attn_utilisation.split(",")
        ]
    rows = []
    for name, p in profiles:
        row = floor_row(p, args.conversations, target_s=args.target, seed=args.seed)
        if args.simulate:
            row[f"{args.simulate}_ttft_p50_s"] = simulated_p50(p, name, args.simulate, args.conversations, args.seed)
        rows.append(row)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    sim = f" {args.simulate} TTFT p50 |" if args.simulate else ""
    print(f"| Profile | Turns | Own-prefill floor p25 / p50 / p75 | Turns within {args.target:g} s |{sim}")
    print("|---|---|---|---|" + ("---|" if sim else ""))
    for r in rows:
        line = (
            f"| `{r['profile']}` | {r['turns']} | {r['floor_p25_s']:.2f} / {r['floor_p50_s']:.2f} / "
            f"{r['floor_p75_s']:.2f} s | {r['share_within_target']:.0%} |"
        )
        if sim:
            line += f" {r[f'{args.simulate}_ttft_p50_s']:.2f} s |"
        print(line)


if __name__ == "__main__":
    main()

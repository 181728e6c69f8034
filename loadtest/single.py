"""Single-request speed of a profile on an idle engine: prefill tokens/s of a cold prompt and
decode tokens/s at a given context (the GB10 calibration against the 16×GB10 post).

    python -m loadtest.single --profiles gb10x16-tp16-fp8,gb10x16-tp4pp4-fp8

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

"""``python -m loadtest.workloads stats [NAME...]`` prints each generated member's figures (rate,
input/output lengths, the infinite-cache prefix hit rate); ``write NAME PATH [--minutes M]`` writes
one as a Mooncake-format JSONL file (replay it with ``--workload trace:PATH``)."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterable

import orjson

from loadtest.results.metrics import percentile
from loadtest.workloads import FAMILY


def stats(rows: Iterable[dict], horizon_s: float) -> dict[str, float]:
    """Rate, input/output length figures and the ideal (infinite-cache) prefix hit rate, computed on
    chained blocks (a block is reused only after the same blocks before it, as an engine sees it)."""
    seen: set[tuple[int, int]] = set()
    inputs: list[int] = []
    outputs: list[int] = []
    total = hit = 0
    for row in rows:
        ids = row["hash_ids"]
        inputs.append(row["input_length"])
        outputs.append(row["output_length"])
        n = row["input_length"]
        reused = 0
        walking = True
        key: tuple[int, ...] | tuple[int, int] = ()
        for j, h in enumerate(ids):
            key = (hash(key), h)  # the block after the same blocks (an engine's chained key)
            if walking and key in seen:
                reused += min(512, n - 512 * j)
            else:
                walking = False
            seen.add(key)
        total += n
        hit += reused
    return {
        "requests_per_s": round(len(inputs) / horizon_s, 2),
        "input_mean": round(statistics.fmean(inputs)),
        "input_p50": round(percentile(inputs, 50) or 0),
        "input_p95": round(percentile(inputs, 95) or 0),
        "output_mean": round(statistics.fmean(outputs)),
        "output_p50": round(percentile(outputs, 50) or 0),
        "ideal_hit": round(hit / total, 3) if total else 0.0,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m loadtest.workloads")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("stats")
    st.add_argument("names", nargs="*")
    st.add_argument("--minutes", type=float, default=20.0)
    st.add_argument("--seed", type=int, default=1)
    wr = sub.add_parser("write")
    wr.add_argument("name")
    wr.add_argument("path")
    wr.add_argument("--minutes", type=float, default=60.0)
    wr.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    horizon = a.minutes * 60
    if a.cmd == "stats":
        for name in a.names or list(FAMILY):
            rows = list(FAMILY[name].make(seed=a.seed).rows(horizon))
            print(name, stats(rows, horizon))
        return
    with open(a.path, "wb") as fh:
        for row in FAMILY[a.name].make(seed=a.seed).rows(horizon):
            fh.write(orjson.dumps(row) + b"\n")


if __name__ == "__main__":
    main()

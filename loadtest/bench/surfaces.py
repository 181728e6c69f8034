"""Added latency of a translated stream (/v1/messages, /v1/responses → upstream chat) over a chat
passthrough stream, through the same gateway, in front of an upstream that answers at once.

    python -m loadtest.bench.surfaces [--requests 400]

The upstream (``loadtest.bench.overhead.upstream_app``, its own process) answers every streamed
request with the same 8-chunk chat stream + usage chunk + [DONE]. The gateway runs with
``--backend URL --model M`` (both surfaces translated, the default). Requests go one at a time,
interleaved chat / messages / responses so drift hits all three alike, after a warm-up; each is
timed from send to the last byte (the whole stream) and to the first body byte. Prints p50 and p99
per surface and the translated surfaces' difference to chat.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import httpx

from loadtest.bench.overhead import MODEL, _q, instant_stack

SYSTEM = "You are a coding agent. " * 40
USER = "Fix the bug in main.py. " * 20
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "stream": True,
            "max_tokens": 8,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
        },
    ),
    "messages": (
        "/v1/messages",
        {
            "model": MODEL,
            "stream": True,
            "max_tokens": 8,
            "system": SYSTEM,
            "messages": [{"role": "user", "content": USER}],
        },
    ),
    "responses": (
        "/v1/responses",
        {"model": MODEL, "stream": True, "max_output_tokens": 8, "instructions": SYSTEM, "input": USER, "store": False},
    ),
}


def one(client: httpx.Client, url: str, surface: str) -> tuple[float, float]:
    """(seconds to the first body byte, seconds to the last byte) of one streamed request."""
    path, body = BODIES[surface]
    start = time.perf_counter()
    first = 0.0
    with client.stream("POST", url + path, json=body) as r:
        assert r.status_code == 200, (surface, r.status_code, r.read())
        for _ in r.iter_raw():
            if not first:
                first = time.perf_counter() - start
    return first, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()
    with instant_stack(["--access-log", "off"]) as (_, gw, _proc), httpx.Client(timeout=30) as client:
        for _ in range(50):  # warm every path
            for surface in BODIES:
                one(client, gw, surface)
        first: dict[str, list[float]] = {s: [] for s in BODIES}
        last: dict[str, list[float]] = {s: [] for s in BODIES}
        for _ in range(args.requests):
            for surface in BODIES:
                f, total = one(client, gw, surface)
                first[surface].append(f)
                last[surface].append(total)
    for values in (*first.values(), *last.values()):
        values.sort()
    print(f"{args.requests} sequential streamed requests per surface, interleaved; instant upstream (8 chunks)")
    print(
        "| surface | first byte p50 | first byte p99 | whole stream p50 | whole stream p99 "
        "| added over chat p50 | added over chat p99 |"
    )
    print("|---|---|---|---|---|---|---|")
    for surface in BODIES:
        added = (
            (
                f"{_q(last[surface], 0.5) - _q(last['chat'], 0.5):+.2f} ms | "
                f"{_q(last[surface], 0.99) - _q(last['chat'], 0.99):+.2f} ms"
            )
            if surface != "chat"
            else "- | -"
        )
        print(
            f"| {surface} | {_q(first[surface], 0.5):.2f} ms | {_q(first[surface], 0.99):.2f} ms | "
            f"{_q(last[surface], 0.5):.2f} ms | {_q(last[surface], 0.99):.2f} ms | {added} |"
        )


if __name__ == "__main__":
    main()

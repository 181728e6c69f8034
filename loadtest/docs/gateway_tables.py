"""Regenerate the `gateway` tables of ``docs/benchmarks.md``: admission and routing.

    python -m loadtest.docs.gateway_tables            # run the simulations (2 processes), rewrite both sections

Each row is one ``cachegate simulate`` run (seed 1); the command for every table is printed above
it. Seat parameters are varied with ``--config`` files holding an ``admission:`` section (e.g.
``admission: {quantum_s: 1200}``).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from loadtest.docs.gateway_admission import BEGIN as BEGIN
from loadtest.docs.gateway_admission import END as END
from loadtest.docs.gateway_admission import render as render
from loadtest.docs.gateway_routing import RBEGIN as RBEGIN
from loadtest.docs.gateway_routing import REND as REND
from loadtest.docs.gateway_routing import render_routing as render_routing
from loadtest.docs.gateway_runs import _run, routing_jobs
from loadtest.docs.gateway_runs import jobs as jobs


def write(section: str, path: Path, begin: str = BEGIN, end: str = END) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: section, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--routing", action="store_true", help="only the routing section's runs and section")
    args = parser.parse_args()
    t = time.perf_counter()
    if args.routing:
        with ProcessPoolExecutor(args.jobs) as pool:
            rows = dict(pool.map(_run, routing_jobs()))
        routing = render_routing(rows)
        write(routing, args.doc, RBEGIN, REND)
        print(routing)
        return
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = dict(pool.map(_run, jobs()))
    section = render(rows, time.perf_counter() - t)
    write(section, args.doc)
    routing = render_routing(rows)
    write(routing, args.doc, RBEGIN, REND)
    print(section)
    print(routing)


if __name__ == "__main__":
    main()

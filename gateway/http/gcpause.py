"""The garbage collector's pauses on a relaying worker.

A full (generation 2) collection walks every tracked object in the process and holds the event loop
while it does. On one worker relaying thousands of streams, a burst of streams opening set off several
full collections, each a pause far longer than a chunk's transit, and every chunk of every stream waited
it out (timed with ``loadtest/bench/gc_probe``; the relay's figures now: docs/benchmarks.md, "The relay
at scale"). ``quiet_gc`` runs once the worker has started: one collection, then ``gc.freeze()`` moves
everything alive (modules, the app, the config) to the permanent generation, which no later collection
walks; and a full collection waits for 100 collections of the middle generation instead of 10 (with the
freeze alone the live streams' objects, promoted as they age, still set full collections off again and
again during a burst). Garbage in cycles is still collected, at the next full collection (a stream
leaves next to none: measured with ``gc.DEBUG_SAVEALL``).

A young collection waits for 10,000 more tracked objects than were freed (CPython's default 700),
and every other one also collects the middle generation (default: every tenth). At 700 a worker
serving short requests ran young collections continually, each walking the requests then in flight,
not garbage, and promoting them: a visible share of every request's CPU. At 10,000 it runs none in
steady state (the net growth is a few objects per request), and in a burst each pause stays short:
a young collection walks at most 10,000 objects, a middle one at most those and the survivors of
one young collection, not ten (20,000 with the default 10 made each middle collection a long pause
of its own under a burst of streams). The short request's cost now: docs/benchmarks.md, "The short
request"; how the thresholds were chosen is in that file's git history.

Only in a process that ``cachegate serve`` started (``ENV``, set by gateway/serve.py and inherited
by its workers): an app started in a test process leaves that process's collector alone.
"""

from __future__ import annotations

import gc
import os

ENV = "CACHEGATE_QUIET_GC"
THRESHOLDS = (10_000, 1, 100)


def quiet_gc() -> None:
    """After start-up: collect once, freeze what survived, full collections rarer (module docstring)."""
    if os.environ.get(ENV) != "1":
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)

"""The garbage collector's pauses on a relaying worker.

A full (generation 2) collection walks every tracked object in the process and holds the event loop
while it does. Measured on one worker relaying 2,000 streams (docs/benchmarks.md, "The relay at
scale", "The chunk path"): two to four full collections while a burst of streams opened, 70-540 ms
each, and every chunk of every stream waited that long. ``quiet_gc`` runs once the worker has
started: one collection, then ``gc.freeze()`` moves everything alive (modules, the app, the config:
some 84,000 objects) to the permanent generation, which no later collection walks; and a full
collection waits for 100 collections of the middle generation instead of 10 (with the freeze alone
the live streams' objects, promoted as they age, still set one off every few hundred ms of a burst).
Young collections stay as they are (700 allocations), and garbage in cycles is still collected,
at the next full collection (a stream leaves next to none: measured with ``gc.DEBUG_SAVEALL``).

Only in a process that ``cachegate serve`` started (``ENV``, set by gateway/serve.py and inherited
by its workers): an app started in a test process leaves that process's collector alone.
"""

from __future__ import annotations

import gc
import os

ENV = "CACHEGATE_QUIET_GC"
THRESHOLDS = (700, 10, 100)


def quiet_gc() -> None:
    """After start-up: collect once, freeze what survived, full collections rarer (module docstring)."""
    if os.environ.get(ENV) != "1":
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)

"""Times every garbage collection of each Python process started with this directory on ``PYTHONPATH``
(measuring only; the run it times: docs/benchmarks.md, "The relay at scale"; why the gateway freezes its
collector: gateway/http/gcpause.py):

    PYTHONPATH=$PWD:$PWD/loadtest/bench/gc_probe GC_PROBE_DIR=/tmp/gc cachegate bench --streams 2000

Every 2 s each process writes ``GC_PROBE_DIR/gc-<pid>.json``: its argv, the frozen object count and,
per generation, one ``[monotonic time, pause ms, objects collected]`` per collection
(``gc.callbacks``). ``GC_PROBE_SAVEALL=1`` also keeps what collections find unreachable
(``gc.DEBUG_SAVEALL``) in ``cachegate serve`` processes and writes their types to ``garbage-<pid>.json``.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import json
import os
import sys
import threading
import time

_OUT = os.environ.get("GC_PROBE_DIR")
_stats: dict[int, list[tuple[float, float, int]]] = {0: [], 1: [], 2: []}
_start = [0.0]


def _timed(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _start[0] = time.perf_counter()
    else:
        pause = (time.perf_counter() - _start[0]) * 1000
        _stats[info["generation"]].append((round(time.monotonic(), 2), round(pause, 2), info["collected"]))


def _dump() -> None:
    saveall = os.environ.get("GC_PROBE_SAVEALL") == "1" and "serve" in sys.argv
    if saveall:
        gc.set_debug(gc.DEBUG_SAVEALL)
    while True:
        time.sleep(2)
        with contextlib.suppress(Exception), open(f"{_OUT}/gc-{os.getpid()}.json", "w") as f:
            json.dump({"argv": sys.argv, "frozen": gc.get_freeze_count(), "gc": _stats}, f)
        if saveall:
            types = collections.Counter(type(o).__qualname__ for o in list(gc.garbage))
            with contextlib.suppress(Exception), open(f"{_OUT}/garbage-{os.getpid()}.json", "w") as f:
                json.dump({"n": len(gc.garbage), "types": types.most_common(30)}, f)


if _OUT:
    gc.callbacks.append(_timed)
    threading.Thread(target=_dump, daemon=True).start()

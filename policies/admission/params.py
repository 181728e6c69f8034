"""The seat parameters of ``SeatedAdmission`` (config ``admission:``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SeatParams:
    """Water marks, quantum and hold times of seats, and how the host tier and running cap count.

    Formulas (the package docstring has the reasoning): a seat needs
    ``prompt_tokens + min(max_output_tokens or default_output, output_clip)``; a new seat fits while
    ``Σ seats + need ≤ admit_water · C · share``, a seated conversation grows up to ``high_water · C``;
    ``C = C_gpu + host_water · C_host`` with a host tier (both marks ``kv_overbook · C`` while the whole demand
    fits that); a waiter may take an idle seat after
    ``clip(swap_s / swap_overhead, min_hold_s, quantum_s)`` (``quantum_s`` without a host tier), except where only
    the running cap keeps it out: there (``rotate_by`` "lend") it borrows a free running slot for one turn; a rank
    holds at most ``ceil(running_overbook · max_running_requests · share)`` seats; with ``lend_free`` > 0 a
    waiter borrows a running slot for one turn where at least ``lend_free`` are free and fewer than
    ``lend_max`` lent turns run (only where its prefix is cached when some rank holds ``lend_cached`` of it).

    Defaults: ``admit_water`` 0.85, ``high_water`` 1.0, ``quantum_s`` 900, ``rotate_on`` "waiter",
    ``rotate_by`` "lend", ``min_hold_s`` 20, ``idle_release_s`` 30, ``default_output`` 1024, ``output_clip`` 4096,
    ``input_weight`` 1, ``output_weight`` 1, ``host_water`` 1.0, ``swap_overhead`` 0.01,
    ``running_overbook`` 1.2, ``full_idle_release_s`` 10, ``lend_free`` 0 (off), ``lend_max`` 1,
    ``lend_cached`` 0.5, ``wait_lead_s`` 42, ``cap_patience_s`` 15, ``cap_queue_s`` 30, ``kv_overbook`` 1.1,
    ``shared_blocks`` off, ``release_first_turns`` off (both on for many one-shot requests over shared prefixes).
    A waiter is overdue after its team's ``max_wait_s − wait_lead_s``; where only the running cap keeps it out
    it takes a free running slot after ``cap_patience_s`` and joins the engine's queue after ``cap_queue_s``.
    """

    high_water: float = 1.0
    admit_water: float = 0.85
    quantum_s: float = 900.0
    min_hold_s: float = 20.0
    rotate_on: str = "waiter"
    """What makes an idle seat revocable for a waiter: "waiter" (the waiter has waited ``quantum_s``;
    the seat was held ``min_hold_s``) or "seat" (the seat was held ``quantum_s``)."""
    rotate_by: str = "lend"
    """How a waiter that has waited the quantum is served where only the running cap (not the KV) keeps it
    out: "lend" (it borrows a free running slot for one turn, whatever ``lend_free``; no seat is evicted) or
    "evict" (it takes an idle seat, as where the KV keeps it out)."""
    idle_release_s: float = 30.0
    default_output: int = 1024
    output_clip: int = 4096
    input_weight: float = 1.0
    output_weight: float = 1.0
    # Tiers: see "Every tier" in the package docstring.
    host_water: float = 1.0
    swap_overhead: float = 0.01
    running_overbook: float = 1.2
    full_idle_release_s: float = 10.0
    # Lending (off by default): the trade-off is under "Lending" in the package docstring.
    lend_free: int = 0
    """A waiter that the running cap (not the KV) keeps from a seat borrows a running slot for one turn on
    a rank with at least this many running slots free (0: never lend)."""
    lend_max: int = 1
    """Lent turns in flight per rank at most."""
    lend_cached: float = 0.5
    """A waiter of which some rank holds this share of the prompt (the router's belief) borrows only there."""
    # The wait bound (the team's ``max_wait_s``): see "Bounded waits" in the package docstring.
    wait_lead_s: float = 42.0
    """A waiter is overdue ``wait_lead_s`` before its team's ``max_wait_s``: time left for the engine's
    queue and a recompute of its context before its first token."""
    kv_overbook: float = 1.1
    """While the whole demand (every conversation running or seen within ``full_idle_release_s``) fits this many
    times the capacity, both marks are that: the engine's LRU absorbs a small overflow at a small recompute
    (with contexts just past its pool ``direct`` serves every turn promptly, where seats at ``admit_water`` of
    it made turns wait far longer); past it, the marks protect the pool (a working set well past it thrashes
    it). Measured: docs/benchmarks.md, "Bounded waits"."""
    cap_patience_s: float = 15.0
    """Where only the running cap (not the KV) keeps a waiter out, it takes a free running slot on a rank after
    this long, one turn, even where seated turns would take it (``rotate_by`` "lend")."""
    shared_blocks: bool = False
    """Reserve the prompt blocks that seats on one slot share once (``blocks.py``), as the engine's radix cache
    holds them. On for many short requests over shared prefixes (150 tenants × 6k-token prompts: the seats then
    fit what the engine holds, and routing keeps its hit rate); off by default, because the water marks and
    ``kv_overbook`` were set with each seat counting its whole prompt, and long coding conversations at and
    past the pool lose throughput with it on (docs/benchmarks.md, "Shared prefixes and one-shot turns")."""
    release_first_turns: bool = False
    """A turn that continues no known conversation gives up its seat when it ends (``anchors.py``; its anchor
    stays ``idle_release_s`` for a second turn). On for one-shot traffic (on the many-tenant trace, one-shots
    held idle seats for ``idle_release_s`` while new requests waited for a seat: docs/benchmarks.md, "Shared
    prefixes and one-shot turns"); off by default, because a coding conversation's second turn then waits
    for a new seat under pressure."""
    cap_queue_s: float = 30.0
    """... and after this long it joins the engine's own queue on the rank the router chooses (its prefix's),
    no free slot needed: nothing is evicted, only a place in a queue is taken."""

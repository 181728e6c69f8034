"""Cache-protecting admission: team limits, a fair queue, and seats on backends.

``SeatedAdmission`` is the decision core of the ``gateway`` stack. It decides
*when* a request may go; its router decides *where* a conversation sits.

Seats
-----
A conversation admitted to a backend (a DP rank of it) holds a **seat** there. The seat reserves
the conversation's KV: ``need = prompt_tokens + min(max_output_tokens or default_output, output_clip)``,
kept through the think pause between turns, so the conversation's next turn goes straight through
and finds its prefix still cached. Prompt blocks that seats on one slot share (a system prompt, a
tenant's instructions) can be reserved once there, as the engine's radix cache holds them once
(``shared_blocks``, ``blocks.py``: a new seat needs only what the slot's seats do not already hold), and a
turn that continues no known conversation can hold its seat only while it runs (``release_first_turns``,
``anchors.py``). Both are for many one-shot requests over shared prefixes and off by default: the marks
below were set with each seat counting its whole prompt, and coding conversations lose throughput with
either on (docs/benchmarks.md, "Shared prefixes and one-shot turns").

A backend (rank) with capacity ``C`` (``max_total_num_tokens``) grants a new seat only while
``Σ seats + need ≤ admit_water · C``. Seated conversations grow turn by turn into the gap up to
``high_water · C``; a turn that would pass it first releases idle seats
there (held at least ``min_hold_s``); if none may go it still goes while the pool is not full, and
waits otherwise (at most its patience). The gap between the two marks is what lets conversations grow
without a swap on every turn: most seats end with their conversation.

Seats only where the KV truly binds: while the demand (the last size of every conversation running,
or that arrived or ended a turn within ``full_idle_release_s``) fits ``kv_overbook · C`` (1.1),
both marks are ``kv_overbook · C``: nobody waits for a seat, the engine's own LRU absorbs an overflow
that small at a small recompute (with contexts just past its pool ``direct`` serves every turn promptly,
where seats at ``admit_water`` of it made turns wait far longer; docs/benchmarks.md, "Bounded waits").
Past it, the marks protect the pool, and the excess waits at the gateway instead of thrashing
the engine, within the bound below.

A seat is given up when
- its conversation has been idle ``idle_release_s`` (it ended, or its user went away);
- a conversation waiting for a seat that does not fit has waited ``quantum_s``, and the seat is idle
  (between turns) and has been held ``min_hold_s`` (``rotate_on="waiter"``, the default: waits are
  bounded by about the quantum, and when conversations end fast enough to seat the waiters no seat is
  ever swapped; ``rotate_on="seat"`` instead rotates any seat held ``quantum_s`` while others wait);
- others wait in a higher priority band, or from a team served less than the seat's team, and the
  seat has been held ``min_hold_s`` (fairness must not wait a whole quantum).
A swap-in costs a full recompute of the context, so the quantum trades throughput against waiting.
Where only the running cap (not the KV) keeps the waiter out, the quantum lends instead of evicting
(``rotate_by`` "lend", the default): the waiter borrows a free running slot for one turn and no seat
is given up (see Lending).
Victims are chosen per backend so that the fewest seats are released, most-served team first,
then oldest seat.

Order of the waiting room
-------------------------
Turns of seated conversations go first (they take no new capacity), then new seats: priority band
(higher first), then the team's virtual token counter (lowest first: ``policies/teams.py``), then
arrival. A new-seat request that does not fit keeps the slot where it is shortest of room: new
seats behind it may go only to the model's other slots (backfill that cannot delay it, so large
conversations are not starved by small ones; with one slot, nothing passes it). A request that can
never fit is refused on arrival (``policies/request_limits.py``). Team caps (``max_concurrency``)
skip a team without blocking others.

Every tier
---------------------
A seat's budget counts every tier a backend reports, not only its GPU pool:

- **Host tier** (HiCache): a seat evicted from the GPU lands in host DRAM and comes back at the
  backend's reload rate (about 0.1 s per 150k tokens on 8×B300) instead of a recompute. So the
  budget is ``C_gpu + host_water · C_host`` (``host_water`` 1.0: the whole host tier; when the
  working set fits the tiers no one waits for a seat), and the quantum after which a waiter may
  take an idle seat is the seat's own swap cost divided by ``swap_overhead`` (0.01: a rotation
  may cost at most 1 % of the time a seat is held), clipped to [``min_hold_s``, ``quantum_s``].
  A cheap swap therefore rotates in about ``min_hold_s`` instead of waiting the recompute
  quantum; without a host tier the quantum stays ``quantum_s``.
- **Running cap**: a backend's ``max_running_requests`` (per DP rank, from ``/get_server_info``) is
  a seat budget too: at most ``ceil(running_overbook · max_running_requests)`` seats per rank
  (``running_overbook`` 1.2: a seated conversation spends part of its time thinking, so a few more
  seats than running slots keep the cap busy without queueing turns in the engine); on a rank whose
  seats are all taken while others wait, a seat idle ``full_idle_release_s`` (10 s, above the
  longest think time) is released, so an ended conversation frees its seat at once.

  The host tier is not reported by SGLang: the live gateway takes it from a backend's config
  (``host_tier_tokens``, ``host_load_tokens_per_s`` in ``backends/config.py``).

Lending
-------
**At the quantum** (``rotate_by`` "lend", the default): a waiter that the running cap, not the KV, keeps
from a seat and that has waited the quantum borrows any free running slot for one turn (a one-shot
seat, released when the turn ends; at most ``lend_max`` lent turns per rank; on the rank holding its
prefix as below), instead of evicting an idle seat. Under a running cap the seats are few (6 per DP
rank of 5 slots) and the seated conversations are the long ones, with the most cached context: an
eviction there drops a ~150k-token cache for a conversation that comes back only a quantum later with
a full recompute, and when the waiters all reach the quantum together (a cohort started at once) every
idle seat of the rank rotates. A lent turn costs one prefill of the waiter and keeps every seat, and
each waiter still gets a turn within about the quantum. With ``rotate_by`` "evict" the quantum takes an
idle seat, as where the KV keeps the waiter out. The runs that made "lend" the default are in the git
history of docs/benchmarks.md (its current tables run the default).

**Always** (``lend_free`` > 0, off by default): a waiter that the running cap (not the KV) keeps from a
seat borrows a running slot for one turn (a one-shot seat, released when the turn ends) on a rank with
at least ``lend_free`` running slots free and fewer than ``lend_max`` lent turns in flight; when the
router believes some rank holds ``lend_cached`` of its prompt, only there (a lent turn on another rank
recomputes its context, which under DP attention stalls every rank). It trades the median and p95 TTFT
(every lent turn has waited) for much shorter waits for a seat (measured when it was added: the git
history of docs/benchmarks.md; its current tables leave it off).

Bounded waits
-------------
A team's ``max_wait_s`` (``policies/teams.py``, default 300 s) is a bound the core plans for, not a
timeout that refuses. A waiter is **overdue** once it has waited ``max_wait_s − wait_lead_s`` (``wait_lead_s``
42 s: left for the engine's queue and a recompute of its context before the first token, the
longest measured on bf16 at 48-64 conversations). Then

- it goes before every waiter that is not overdue (overdue ones oldest first), whatever the fair order;
- it may take idle seats (held ``min_hold_s``) whatever the quantum: the patience before an idle seat
  gives way is ``min(quantum, deadline)``; the oldest seat gives way first (a round robin of slices);
- where only the running cap keeps a waiter out (the KV has room), it does not wait for the bound at
  all: after ``cap_patience_s`` (15 s) it takes a free running slot on the rank the router chooses (its
  prefix's) even where a seated turn would take it, and after ``cap_queue_s`` (30 s) it joins the engine's
  own queue there, no free slot needed and no seat evicted: nothing is lost but a place in a queue;
- half of ``wait_lead_s`` later, with no idle seat to take, it goes to the router's slot past the seat
  budget (reason ``overdue``): the engine's own behaviour, where bounded waits and protection cannot
  both be had (the other half of the lead is left for the engine).

Each rotation for the bound costs a recompute of the context that comes back. Out of ``N``
conversations of which ``K`` fit the KV, keeping every wait under ``W`` takes about ``(N − K) / W``
rotations a second, so the throughput lost is about ``(N − K) · R / W`` of the engine's time (``R``: one
recompute). Where the cache holds the conversations (``N ≤ K``) the bound costs nothing; where it does
not, the frontier between throughput and the bound is a table in docs/benchmarks.md ("Bounded waits").
``snapshot`` shows each team's oldest waiter, the expected wait of a request arriving now (its team's
queue times its mean dispatch interval, at most the bound) and the bound (``/admin/state``, and the
``cachegate_oldest_wait_seconds``, ``cachegate_expected_wait_seconds`` and ``cachegate_wait_bound_seconds``
gauges).

Parameters and defaults: ``admit_water`` 0.85, ``high_water`` 1.0, ``quantum_s`` 900,
``rotate_on`` "waiter", ``rotate_by`` "lend", ``min_hold_s`` 20, ``idle_release_s`` 30,
``default_output`` 1024, ``output_clip`` 4096 (SGLang's own clip), ``input_weight`` 1 and ``output_weight`` 1 (tokens
charged to a team's counter per token served), ``host_water`` 1.0, ``swap_overhead`` 0.01,
``running_overbook`` 1.2, ``full_idle_release_s`` 10, ``lend_free`` 0, ``lend_max`` 1,
``lend_cached`` 0.5, ``wait_lead_s`` 42, ``cap_patience_s`` 15, ``cap_queue_s`` 30, ``kv_overbook`` 1.1;
per team ``max_wait_s`` 300.
Figures behind these choices: docs/benchmarks.md, "Admission control", "Bounded waits" and "Shared
prefixes and one-shot turns".

Modules, one job each: ``params.py`` (``SeatParams``), ``records.py`` (seats, waiters, running
dispatches), ``limits.py`` (team caps, queue bounds, token rates at the door), ``sizing.py`` (seat
budgets per slot, every tier: GPU pool, host tier, running cap), ``blocks.py`` (shared prompt blocks counted
once per slot), ``anchors.py`` (conversations known by anchor; first turns), ``order.py`` (fair order, placement
and victim selection), ``core.py`` (``SeatedAdmission``: the events, wiring the above).
"""

from policies.admission.core import SeatedAdmission
from policies.admission.params import SeatParams
from policies.admission.records import ModelViews, Placement, Running, Seat, Waiter

__all__ = ["ModelViews", "Placement", "Running", "Seat", "SeatParams", "SeatedAdmission", "Waiter"]

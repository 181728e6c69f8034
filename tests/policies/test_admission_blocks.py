"""Shared prompt blocks reserved once per slot, and first turns of no known conversation (no I/O)."""

from __future__ import annotations

import itertools

from policies.admission import SeatedAdmission, SeatParams
from policies.routing import RoundRobin
from policies.types import BackendView, Dispatch, Fingerprint, Outcome, RequestFacts

_ids = itertools.count()
B = 100  # tokens per block in these fingerprints


def fp(*blocks: int, tail: int = 0) -> Fingerprint:
    """Chained blocks named by ints (each ``B`` tokens), then a partial block of ``tail`` tokens."""
    out = [(hash(("chain", *blocks[: i + 1])), B) for i in range(len(blocks))]
    if tail:
        out.append((hash(("tail", *blocks, tail, next(_ids))), tail))
    return tuple(out)


def req(f: Fingerprint, out: int = 100, conv: str | None = None) -> RequestFacts:
    return RequestFacts(
        rid=f"r{next(_ids)}",
        model="m",
        prompt_tokens=sum(t for _, t in f),
        max_output_tokens=out,
        fingerprint=f,
        conversation=conv,
    )


def core(kv: int, **params: float | bool) -> SeatedAdmission:
    base = {"admit_water": 1.0, "high_water": 1.0, "shared_blocks": True, "release_first_turns": True}
    c = SeatedAdmission(RoundRobin(), params=SeatParams(**{**base, **params}))  # type: ignore[arg-type]
    c.set_backends("m", [BackendView("b0", kv_tokens=kv)], 0.0)
    return c


def went(decisions: list) -> list[str]:
    return [d.rid for d in decisions if isinstance(d, Dispatch)]


def test_a_shared_prefix_is_reserved_once() -> None:
    """Two conversations on a 20-block prefix with 2 blocks of their own: the second seat adds only its own
    blocks and output, so it fits where a full second reservation (2,200 + 100) would not."""
    c = core(kv=2_700)
    prefix = tuple(range(20))
    first = req(fp(*prefix, 100, tail=50), conv="a")
    second = req(fp(*prefix, 200, tail=50), conv="b")
    assert went(c.arrive(first, 0.0)) == [first.rid]
    assert c.reserved[("b0", None)] == 2_150 + 100
    assert went(c.arrive(second, 0.0)) == [second.rid]  # 2,250 + 250 ≤ 2,700; 2,250 + 2,250 is not
    assert c.reserved[("b0", None)] == 2_250 + 250
    c.finish(first.rid, Outcome(prompt_tokens=2_150, completion_tokens=100), 1.0)
    c._release(c.seats["a"])
    assert c.reserved[("b0", None)] == 2_250  # the prefix stays reserved for b: nothing of it is freed


def test_without_the_shared_prefix_the_second_waits() -> None:
    c = core(kv=2_700)
    first = req(fp(*range(20), 100, tail=50), conv="a")
    other = req(fp(*range(100, 120), 200, tail=50), conv="b")  # the same size, nothing shared
    assert went(c.arrive(first, 0.0)) == [first.rid]
    assert went(c.arrive(other, 0.0)) == []


def test_a_first_turn_gives_up_its_seat_and_a_second_turn_keeps_one() -> None:
    c = core(kv=100_000, idle_release_s=30.0)
    turn1 = req(fp(1, 2, 3, tail=40))
    assert went(c.arrive(turn1, 0.0)) == [turn1.rid]
    key = next(iter(c.seats))
    c.finish(turn1.rid, Outcome(prompt_tokens=340, completion_tokens=50), 2.0)
    assert c.seats == {} and c.reserved[("b0", None)] == 0  # a one-shot holds nothing once done
    turn2 = req(fp(1, 2, 3, 4, 5, tail=30))  # extends turn 1's last full block (3): the same conversation
    assert went(c.arrive(turn2, 5.0)) == [turn2.rid]
    assert list(c.seats) == [key]
    c.finish(turn2.rid, Outcome(prompt_tokens=530, completion_tokens=50), 8.0)
    assert list(c.seats) == [key]  # a known conversation keeps its seat through its think time
    assert c.seats[key].busy == 0


def test_a_first_turns_anchor_is_forgotten_after_idle_release() -> None:
    c = core(kv=100_000, idle_release_s=30.0)
    turn1 = req(fp(1, 2, 3, tail=40))
    c.arrive(turn1, 0.0)
    c.finish(turn1.rid, Outcome(prompt_tokens=340, completion_tokens=50), 2.0)
    assert c.anchors
    c.tick(40.0)
    assert c.anchors == {}
    late = req(fp(1, 2, 3, 4, tail=30))
    c.arrive(late, 41.0)
    assert all(k.startswith("rid:") and k != f"rid:{turn1.rid}" for k in c.seats)


def test_off_by_default_each_seat_counts_its_whole_prompt_and_a_first_turn_keeps_its_seat() -> None:
    c = SeatedAdmission(RoundRobin(), params=SeatParams(admit_water=1.0, high_water=1.0))
    c.set_backends("m", [BackendView("b0", kv_tokens=2_700)], 0.0)
    first = req(fp(*range(20), 100, tail=50))
    second = req(fp(*range(20), 200, tail=50))
    assert went(c.arrive(first, 0.0)) == [first.rid]
    assert went(c.arrive(second, 0.0)) == []  # 2,250 + 2,250 > 2,700: the shared prefix counts twice
    c.finish(first.rid, Outcome(prompt_tokens=2_150, completion_tokens=100), 1.0)
    assert list(c.seats) == [f"rid:{first.rid}"]  # held through a think time, as before

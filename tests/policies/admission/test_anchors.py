"""policies/admission/anchors.py: a seated conversation is known by its anchor (the last full block of
its latest prompt); with ``release_first_turns`` a first turn gives up its seat when it ends and its
anchor stays ``idle_release_s``. ``Anchoring`` is a mixin of ``SeatedAdmission``: driven through one."""

from __future__ import annotations

import itertools

from policies.admission import SeatedAdmission, SeatParams
from policies.routing import RoundRobin
from policies.types import BackendView, Dispatch, Fingerprint, Outcome, RequestFacts

_ids = itertools.count()


def _fp(*blocks: int) -> Fingerprint:
    """Chained blocks of 100 tokens named by ints (a key stands for the prefix up to it)."""
    return tuple((hash(("chain", *blocks[: i + 1])), 100) for i in range(len(blocks)))


def _core(**params: float | bool) -> SeatedAdmission:
    c = SeatedAdmission(RoundRobin(), params=SeatParams(**{"idle_release_s": 30.0, **params}))  # type: ignore[arg-type]
    c.set_backends("m", [BackendView("b0", kv_tokens=1_000_000)], 0.0)
    return c


def _turn(c: SeatedAdmission, fp: Fingerprint, now: float, conv: str | None = None) -> str:
    r = RequestFacts(
        rid=f"r{next(_ids)}",
        model="m",
        prompt_tokens=100 * len(fp),
        max_output_tokens=10,
        fingerprint=fp,
        conversation=conv,
    )
    [d] = c.arrive(r, now)
    assert isinstance(d, Dispatch)
    return r.rid


def test_the_anchor_is_the_last_full_block_and_follows_the_conversation() -> None:
    c = _core()
    first = _fp(1, 2, 3, 4)
    rid = _turn(c, first, 0.0)
    [key] = c.seats
    assert c.anchors == {first[-2][0]: key} and c.seats[key].anchor == first[-2][0]
    c.finish(rid, Outcome(prompt_tokens=400, completion_tokens=10), 1.0)
    second = _fp(1, 2, 3, 4, 5, 6)  # extends the anchor: the same conversation, re-anchored further on
    _turn(c, second, 5.0)
    assert list(c.seats) == [key]
    assert c.anchors == {second[-2][0]: key}  # the old anchor is forgotten


def test_a_one_block_prompt_is_anchored_by_that_block() -> None:
    c = _core()
    only = _fp(9)
    _turn(c, only, 0.0)
    assert list(c.anchors) == [only[0][0]]


def test_a_conversation_named_by_the_caller_needs_no_anchor() -> None:
    c = _core()
    _turn(c, _fp(1, 2, 3), 0.0, conv="known")
    assert list(c.seats) == ["known"] and c.anchors == {}


def test_off_by_default_a_first_turn_keeps_its_seat() -> None:
    c = _core()
    rid = _turn(c, _fp(1, 2, 3), 0.0)
    c.finish(rid, Outcome(prompt_tokens=300, completion_tokens=10), 1.0)
    assert len(c.seats) == 1 and len(c.anchors) == 1


def test_a_released_first_turn_keeps_its_anchor_for_a_second_turn() -> None:
    c = _core(release_first_turns=True)
    first = _fp(1, 2, 3)
    rid = _turn(c, first, 0.0)
    [key] = c.seats
    c.finish(rid, Outcome(prompt_tokens=300, completion_tokens=10), 2.0)
    assert c.seats == {} and c.reserved[("b0", None)] == 0
    assert c.anchors == {first[-2][0]: key}
    assert list(c._loose) == [(2.0, first[-2][0], key)]
    second = _fp(1, 2, 3, 4)
    _turn(c, second, 10.0)  # known by the kept anchor: seated again as the same conversation
    assert list(c.seats) == [key]
    assert c.anchors[second[-2][0]] == key  # anchored on its latest prompt
    c.tick(33.0)  # the loose entry expires; the conversation keeps its seat
    assert not c._loose and list(c.seats) == [key]


def test_an_unclaimed_anchor_expires_after_idle_release_and_not_before() -> None:
    c = _core(release_first_turns=True)
    rid = _turn(c, _fp(1, 2, 3), 0.0)
    c.finish(rid, Outcome(prompt_tokens=300, completion_tokens=10), 2.0)
    c.tick(32.0)  # 30 s exactly: not yet past idle_release_s
    assert len(c.anchors) == 1
    c.tick(32.5)
    assert c.anchors == {} and not c._loose


def test_an_expired_loose_entry_leaves_an_anchor_another_conversation_took() -> None:
    c = _core(release_first_turns=True)
    shared = _fp(1, 2, 3)
    rid = _turn(c, shared, 0.0)
    c.finish(rid, Outcome(prompt_tokens=300, completion_tokens=10), 2.0)
    [(anchor, first_key)] = c.anchors.items()
    c.anchors[anchor] = "someone-else"  # the anchor now names another conversation
    c.tick(40.0)
    assert c.anchors == {anchor: "someone-else"} and first_key != "someone-else"


def test_every_anchor_goes_once_a_reseated_first_turns_conversation_ends() -> None:
    c = _core(release_first_turns=True)
    rid = _turn(c, _fp(1, 2, 3), 0.0)
    c.finish(rid, Outcome(prompt_tokens=300, completion_tokens=10), 2.0)
    rid = _turn(c, _fp(1, 2, 3, 4), 10.0)  # the second turn, seated again by the kept anchor
    c.finish(rid, Outcome(prompt_tokens=400, completion_tokens=10), 11.0)
    c.tick(100.0)  # idle past idle_release_s: the seat goes, and the loose entry has expired
    assert c.seats == {} and not c._loose
    assert c.anchors == {}

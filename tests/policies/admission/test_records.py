"""policies/admission/records.py: the conversation a request continues (by id or anchor), the waits
per team, the admin snapshot, and a request retried elsewhere."""

from __future__ import annotations

from policies.admission.records import Seat, Waiter, conversation_of, snapshot_of, waits_of, with_exclude
from policies.teams import TeamLimits, TeamState
from policies.types import RequestFacts

FP = tuple((1000 + i, 100) for i in range(10))  # ten blocks of 100 tokens: 1,000 tokens


def _req(rid: str = "r", fp: tuple[tuple[int, int], ...] = FP, conversation: str | None = None) -> RequestFacts:
    return RequestFacts(rid=rid, model="m", fingerprint=fp, conversation=conversation)


def _waiter(rid: str, team: str, arrived: float) -> Waiter:
    return Waiter(RequestFacts(rid=rid, model="m", team=team), f"rid:{rid}", 100, arrived, 0, False)


def test_a_conversation_given_by_the_caller_wins() -> None:
    assert conversation_of(_req(conversation="c1"), {FP[8][0]: "other"}) == ("c1", False)


def test_without_an_anchor_a_request_is_its_own_conversation() -> None:
    assert conversation_of(_req("r7"), {}) == ("rid:r7", False)
    assert conversation_of(_req("r8", fp=()), {}) == ("rid:r8", True)  # no fingerprint: a one-shot


def test_an_anchor_near_the_end_continues_its_conversation() -> None:
    assert conversation_of(_req(), {FP[8][0]: "conv"}) == ("conv", False)
    assert conversation_of(_req(), {FP[9][0]: "conv"}) == ("conv", False)  # the very last block


def test_an_anchor_followed_by_more_than_precedes_it_is_not_a_continuation() -> None:
    # what follows block 4 (blocks 5-9, 500 tokens) is no longer than what precedes it with it (500): a turn
    assert conversation_of(_req(), {FP[4][0]: "conv"}) == ("conv", False)
    # block 3 is followed by 600 tokens and preceded by 400: a system prompt's block, another conversation
    assert conversation_of(_req(), {FP[3][0]: "conv"}) == ("rid:r", False)


def test_the_deepest_anchor_wins() -> None:
    anchors = {FP[6][0]: "older", FP[8][0]: "newer"}
    assert conversation_of(_req(), anchors) == ("newer", False)


def test_waits_per_team() -> None:
    busy = TeamState("busy", TeamLimits(max_wait_s=100.0), 0.0)
    busy.waiting, busy.dispatch_interval = 2, 7.5
    jammed = TeamState("jammed", TeamLimits(max_wait_s=100.0), 0.0)
    jammed.waiting, jammed.dispatch_interval = 50, 10.0
    idle = TeamState("idle", TeamLimits(), 0.0)
    waiters = {
        "a": _waiter("a", "busy", 10.0),
        "b": _waiter("b", "busy", 4.0),
        "c": _waiter("c", "jammed", 19.5),
    }
    waits = waits_of({"busy": busy, "jammed": jammed, "idle": idle}, waiters, 20.0)
    assert waits["busy"] == {"oldest_wait_s": 16.0, "expected_wait_s": 15.0, "max_wait_s": 100.0}
    assert waits["jammed"] == {"oldest_wait_s": 0.5, "expected_wait_s": 100.0, "max_wait_s": 100.0}  # at the bound
    assert waits["idle"] == {"oldest_wait_s": 0.0, "expected_wait_s": 0.0, "max_wait_s": 300.0}


def test_snapshot_counts_per_team_and_per_slot() -> None:
    team = TeamState("t", TeamLimits(), 0.0)
    team.inflight, team.waiting, team.vtc = 2, 1, 1234.56
    seats = {
        "a": Seat("a", "m", ("b0", None), "t", 500, 0.0, 0.0),
        "b": Seat("b", "m", ("b1", 1), "t", 300, 0.0, 0.0),
        "c": Seat("c", "m", ("b1", 1), "t", 200, 0.0, 0.0),
    }
    reserved = {("b0", None): 500, ("b1", 1): 500, ("b1", 0): 0}
    snap = snapshot_of({"t": team}, seats, reserved, {"w": _waiter("w", "t", 5.0)}, 2, 8.0)
    assert snap["waiting"] == 1 and snap["running"] == 2
    assert snap["backends"] == {
        "b0": {"reserved_tokens": 500, "seats": 1},
        "b1#1": {"reserved_tokens": 500, "seats": 2},
        "b1#0": {"reserved_tokens": 0, "seats": 0},
    }
    assert snap["teams"] == {
        "t": {
            "inflight": 2,
            "waiting": 1,
            "vtc": 1234.6,
            "oldest_wait_s": 3.0,
            "expected_wait_s": 5.0,
            "max_wait_s": 300.0,
        }
    }


def test_with_exclude_adds_the_backend_and_leaves_the_request() -> None:
    req = RequestFacts(rid="r", model="m", exclude=frozenset({"b0"}))
    retried = with_exclude(req, "b1")
    assert retried.exclude == {"b0", "b1"} and retried.rid == "r"
    assert req.exclude == {"b0"}
    assert with_exclude(retried, "b1") == retried

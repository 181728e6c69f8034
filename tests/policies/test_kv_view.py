"""The exact cache view: a mirror follows the event sequence, detects gaps/restarts, and resyncs."""

from __future__ import annotations

from policies.kv_view import BlockMap, EngineMirror, Message, PreciseIndex


def _m(seq: int, *events: tuple, tag: bytes = b"") -> Message:
    return Message(seq, tag or seq.to_bytes(2, "big"), list(events))


def stored(*h: int) -> tuple:
    return ("stored", h, None)


def removed(*h: int) -> tuple:
    return ("removed", h, None)


CLEARED = ("cleared", (), None)


def _fresh() -> EngineMirror:
    m = EngineMirror()
    m.on_replay([], 0.0)  # nothing published yet: an empty cache
    assert m.synced and m.state == "exact"
    return m


def test_stored_removed_cleared_in_order() -> None:
    m = _fresh()
    m.on_message(_m(0, stored(1, 2, 3)), 1.0)
    m.on_message(_m(1, removed(3)), 1.0)
    assert m.blocks == {1, 2} and m.synced
    m.on_message(_m(2, CLEARED, stored(9)), 1.0)
    assert m.blocks == {9} and m.next_seq == 3


def test_gap_unsyncs_and_replay_resyncs() -> None:
    m = _fresh()
    history = [_m(0, stored(1)), _m(1, stored(2)), _m(2, removed(1)), _m(3, stored(4))]
    m.on_message(history[0], 0.0)
    m.on_message(history[1], 0.0)
    assert m.on_message(history[3], 5.0) is True  # message 2 was lost
    assert not m.synced and m.state == "gap" and m.changed_at == 5.0
    assert m.probe_from() == 1  # continuity: the last applied message comes back first
    m.on_replay(history[1:], 6.0)
    assert m.synced and m.blocks == {2, 4} and m.next_seq == 4
    assert m.on_message(history[3], 6.0) is False  # a late duplicate is ignored
    assert m.blocks == {2, 4}


def test_dead_publisher_then_restarted_engine() -> None:
    m = _fresh()
    m.on_message(_m(0, stored(1)), 0.0)
    m.on_message(_m(1, stored(2)), 0.0)
    m.on_probe_timeout(3.0)
    assert not m.synced and m.state == "dead"
    # the engine came back empty: its new publisher has nothing at or after our last message
    m.on_replay([], 4.0)
    assert not m.synced and m.state == "restarted" and m.probe_from() == 0
    m.on_replay([], 5.0)  # asked from 0: nothing published yet, an empty cache
    assert m.synced and m.blocks == set()


def test_restart_detected_by_digest_and_rebuilt_from_zero() -> None:
    m = _fresh()
    for i in range(3):
        m.on_message(_m(i, stored(i + 10)), 0.0)
    # the probe from message 2 finds another payload under that number: a new publisher
    m.on_replay([_m(2, stored(99), tag=b"other")], 1.0)
    assert not m.synced and m.state == "restarted"
    m.on_replay([_m(0, stored(7), tag=b"n0"), _m(1, stored(8), tag=b"n1")], 2.0)
    assert m.synced and m.blocks == {7, 8}


def test_new_seq_zero_while_synced_resets() -> None:
    m = _fresh()
    m.on_message(_m(0, stored(1), tag=b"a"), 0.0)
    m.on_message(_m(1, stored(2), tag=b"b"), 0.0)
    m.on_message(_m(0, stored(5), tag=b"new"), 1.0)  # a restarted engine's first message
    assert m.synced and m.blocks == {5}


def test_unrecoverable_waits_for_a_clear() -> None:
    m = _fresh()
    m.on_message(_m(0, stored(1)), 0.0)
    m.on_message(_m(5, stored(2)), 0.0)
    m.on_replay([_m(3, stored(3)), _m(4, stored(4))], 1.0)  # the buffer no longer holds 0
    assert not m.synced and m.state == "unrecoverable"
    assert m.on_message(_m(6, stored(6), CLEARED, stored(8)), 2.0) is False
    assert m.synced and m.blocks == {8}


def test_precise_index_exact_where_synced_approximate_elsewhere() -> None:
    idx = PreciseIndex(1000, BlockMap(identity=True))
    fp = ((11, 100), (12, 100), (13, 50))
    idx.insert(("a", None), fp)  # the approximate index believes a holds all of it
    assert idx.matched_tokens(("a", None), fp) == 250
    m = idx.mirror(("a", None))
    m.on_replay([], 0.0)
    m.on_message(_m(0, stored(11, 12)), 0.0)
    assert idx.matched_tokens(("a", None), fp) == 200  # the engine evicted (never had) block 13
    m.on_message(_m(1, removed(12)), 0.0)
    assert idx.matched_tokens(("a", None), fp) == 100
    m.on_probe_timeout(1.0)
    assert idx.matched_tokens(("a", None), fp) == 250  # unsynced: back on the approximation


def test_block_map_learned_and_bounded() -> None:
    bm = BlockMap(capacity=2)
    assert bm.learn([(1, 10), (2, 20)]) == 2
    assert bm.learn([(3, 30)]) == 1
    assert bm.get(1) is None and bm.get(3) == 30 and len(bm) == 2

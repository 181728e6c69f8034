"""``backends/kv_events.py``: following one rank's KV events into its ``EngineMirror`` over real ZMQ
sockets on loopback, against the twin's publisher (``backends/sim/kv_publisher.py``, SGLang's
``ZmqEventPublisher`` pattern): catching up by replay, live messages, a lost message, a silent or
missing replay endpoint, malformed frames, and a subscriber that fails and is restarted."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

import msgspec
import pytest

pytest.importorskip("zmq", reason="pyzmq is the kv-events extra (pulled in by [dev])")

from backends.config import KVEventsSource
from backends.kv_events import KVEventsFollower, RankSubscriber, offset, to_message, zmq_available
from backends.kv_wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
    KVEventsConfig,
    encode_batch,
    seq_bytes,
)
from backends.sim.kv_publisher import ZmqPublisher
from backends.sim.testing import free_port
from policies.kv_view import EngineMirror

POLL_S = 0.05


def stored(h: int, medium: str | None = "GPU", size: int = 16) -> BlockStored:
    return BlockStored(
        block_hashes=[h], parent_block_hash=None, token_ids=[7] * size, block_size=size, lora_id=None, medium=medium
    )


def batch(*events: KVEvent) -> KVEventBatch:
    return KVEventBatch(ts=1.0, events=list(events))


def test_a_wire_message_becomes_the_mirrors_message_with_gpu_events_only() -> None:
    payload = encode_batch(
        batch(
            stored(1),
            stored(2, medium=None, size=32),
            stored(3, medium="CPU"),
            BlockRemoved(block_hashes=[4]),
            BlockRemoved(block_hashes=[5], medium="CPU"),
            AllBlocksCleared(),
        )
    )
    msg, block_size = to_message(41, payload)
    assert msg.seq == 41 and msg.digest == hashlib.blake2b(payload, digest_size=16).digest()
    assert msg.events == [("stored", [1], None), ("stored", [2], None), ("removed", [4], None), ("cleared", (), None)]
    assert block_size == 32  # the last GPU store's
    assert to_message(0, encode_batch(batch(BlockRemoved(block_hashes=[1]))))[1] is None  # no store: no size
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        to_message(0, b"\x00garbage")


def test_rank_r_listens_on_port_plus_r() -> None:
    assert offset("tcp://10.0.0.5:5557", 0) == "tcp://10.0.0.5:5557"
    assert offset("tcp://10.0.0.5:5557", 7) == "tcp://10.0.0.5:5564"
    source = KVEventsSource(endpoint="tcp://h:5557", replay_endpoint="tcp://h:6000")
    sub = RankSubscriber("b", 2, source, EngineMirror())
    assert (sub.endpoint, sub.replay) == ("tcp://h:5559", "tcp://h:6002")
    assert RankSubscriber("b", 2, KVEventsSource(endpoint="tcp://h:5557"), EngineMirror()).replay is None
    assert zmq_available()


@contextmanager
def publisher(replay: bool = True) -> Iterator[tuple[ZmqPublisher, KVEventsSource]]:
    port, replay_port = free_port(), free_port()
    cfg = KVEventsConfig(
        publisher="zmq",
        endpoint=f"tcp://127.0.0.1:{port}",
        replay_endpoint=f"tcp://127.0.0.1:{replay_port}" if replay else None,
        bind=True,
    )
    pub = ZmqPublisher(cfg, 0)
    try:
        yield pub, KVEventsSource(endpoint=cfg.endpoint, replay_endpoint=cfg.replay_endpoint, poll_s=POLL_S)
    finally:
        pub.shutdown()


@asynccontextmanager
async def following(source: KVEventsSource, mirror: EngineMirror) -> AsyncIterator[RankSubscriber]:
    sub = RankSubscriber("b", 0, source, mirror)
    follower = KVEventsFollower([sub])
    follower.start()
    try:
        yield sub
    finally:
        await follower.stop()


async def until(condition: Callable[[], bool], timeout: float = 3.0, step: Callable[[], None] | None = None) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        if step is not None:
            step()
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_catches_up_by_replay_then_follows_live_and_fills_a_lost_message() -> None:
    mirror = EngineMirror()
    with publisher() as (pub, source):
        for h in (1, 2, 3):  # published before anyone listens: only the replay has them
            pub.publish(batch(stored(h)))
        await until(lambda: pub.seq == 3)  # sent (to nobody) by the publisher's thread
        async with following(source, mirror) as sub:
            await until(lambda: mirror.synced and mirror.blocks == {1, 2, 3})
            assert mirror.state == "exact" and sub.block_size == 16 and sub.probes >= 1
            # live: publish until the SUB has joined and applied messages itself
            live = iter(range(100, 400))
            await until(lambda: sub.messages > 0, step=lambda: pub.publish(batch(stored(next(live)))))
            probes = sub.probes
            pub.drop_next()  # lost on the wire, kept for replay
            pub.publish(batch(BlockRemoved(block_hashes=[1])))
            pub.publish(batch(stored(999)))
            await until(lambda: 999 in mirror.blocks and 1 not in mirror.blocks and mirror.synced)
            assert sub.probes > probes  # the gap was filled by a replay, not ignored
            assert {2, 3} <= mirror.blocks and mirror.next_seq == pub.seq


async def test_without_a_replay_endpoint_the_mirror_waits_for_a_cleared_cache() -> None:
    mirror = EngineMirror()
    with publisher(replay=False) as (pub, source):
        async with following(source, mirror) as sub:
            await asyncio.sleep(2 * POLL_S)
            assert sub.probes >= 1 and not mirror.synced and mirror.state == "new"  # nothing to ask
            await until(lambda: mirror.synced, step=lambda: pub.publish(batch(AllBlocksCleared(), stored(5))))
            assert mirror.state == "exact" and 5 in mirror.blocks


async def test_a_replay_endpoint_that_never_answers_marks_the_publisher_dead() -> None:
    silent = KVEventsSource(
        endpoint=f"tcp://127.0.0.1:{free_port()}", replay_endpoint=f"tcp://127.0.0.1:{free_port()}", poll_s=POLL_S
    )
    mirror = EngineMirror()
    async with following(silent, mirror) as sub:
        await until(lambda: mirror.state == "dead")
        assert not mirror.synced and sub.probes >= 1 and sub.messages == 0


def test_frames_that_are_not_a_message_are_skipped_or_resynchronised(caplog: pytest.LogCaptureFixture) -> None:
    mirror = EngineMirror()
    sub = RankSubscriber("b", 0, KVEventsSource(endpoint="tcp://h:1"), mirror)

    async def apply_all() -> list[bool]:
        good = encode_batch(batch(stored(8)))
        return [
            sub._apply([b"", seq_bytes(0)]),  # two frames: not a message at all
            sub._apply([b"", seq_bytes(0), good]),  # seq 0 from a fresh mirror: exact
            sub._apply([b"", seq_bytes(1), b"\x00not msgpack"]),  # a lost message: resynchronise
        ]

    with caplog.at_level(logging.WARNING, logger="cachegate.kv_events"):
        needs = asyncio.run(apply_all())
    assert needs == [False, False, True]
    assert mirror.blocks == {8} and mirror.state == "dead" and sub.messages == 1
    assert "undecodable message" in caplog.text


async def test_a_failing_subscriber_is_restarted_without_taking_the_worker_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = RankSubscriber("bad", 0, KVEventsSource(endpoint="tcp://not a host:1", poll_s=POLL_S), EngineMirror())
    good = RankSubscriber("good", 0, KVEventsSource(endpoint="tcp://127.0.0.1:1", poll_s=POLL_S), EngineMirror())
    good.block_size = 64
    follower = KVEventsFollower([broken, good])
    with caplog.at_level(logging.ERROR, logger="cachegate.kv_events"):
        follower.start()
        await until(lambda: caplog.text.count("kv events subscriber bad rank 0 failed") >= 2)  # retried
        assert broken.mirror.state == "dead"
        await follower.stop()
    assert follower._tasks == []
    assert (follower.block_size("good"), follower.block_size("bad"), follower.block_size("other")) == (64, None, None)

"""``backends/sim/kv_publisher.py``: the twin's KV events: pages of a request's text turned into SGLang's
block hashes, the radix observer that coalesces them as SGLang's recorder does, and the ZMQ publisher
(PUB frames, the ROUTER replay from its buffer, a message lost on purpose) over real sockets on loopback."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

zmq = pytest.importorskip("zmq", reason="pyzmq is the kv-events extra (pulled in by [dev])")

from backends.kv_wire import (  # noqa: E402
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventsConfig,
    decode_batch,
    seq_bytes,
    seq_of,
)
from backends.sim.engine import Engine, EngineRequest  # noqa: E402
from backends.sim.kv_publisher import RankRecorder, TwinEvents, ZmqPublisher, page_table  # noqa: E402
from backends.sim.profiles import get_profile  # noqa: E402
from backends.sim.testing import free_port  # noqa: E402
from backends.sim.tokenizer import filler_text, text_blocks  # noqa: E402
from policies.engine_blocks import token_block_hashes  # noqa: E402

PAGE = 4


def test_whole_pages_carry_sglangs_hashes_of_the_texts_bytes_as_token_ids() -> None:
    text = filler_text("p", 3 * PAGE + 2)  # three whole pages and a partial one
    blocks = text_blocks(text, PAGE)
    table = page_table(text, blocks, PAGE)
    assert [key for key, _, _ in table] == [key for key, _ in blocks[:3]]
    ids = list(struct.unpack(f"<{len(text.encode()) // 4}I", text.encode()))  # 4 bytes of UTF-8 per token id
    assert [h for _, h, _ in table] == token_block_hashes(ids, PAGE)  # SGLang's hashes of its full pages
    assert b"".join(p for _, _, p in table) == text.encode()[: 3 * PAGE * 4]
    assert page_table("", [], PAGE) == []


def recorder_with(text: str) -> tuple[RankRecorder, list[tuple[int, int, bytes]]]:
    rec = RankRecorder(PAGE)
    table = page_table(text, text_blocks(text, PAGE), PAGE)
    rec.learn(table)
    return rec, table


def test_stores_of_a_chain_coalesce_and_a_new_branch_names_its_parent() -> None:
    rec, table = recorder_with(filler_text("a", 3 * PAGE))
    (k0, h0, _), (k1, h1, _), (k2, h2, _) = table
    rec.stored(k0, 0, PAGE)
    rec.stored(k1, k0, PAGE)
    rec.stored(k2, k1, PAGE)
    rec.stored(424242, k2, PAGE)  # a key the twin never saw as a request: not published
    rec.stored(k2, k1, PAGE - 1)  # a partial page: SGLang would not cache it
    (event,) = rec.take()
    assert isinstance(event, BlockStored) and event.block_hashes == [h0, h1, h2]
    assert event.parent_block_hash is None and event.block_size == PAGE and event.medium == "GPU"
    assert event.token_ids == list(struct.unpack(f"<{3 * PAGE}I", filler_text("a", 3 * PAGE).encode()))
    assert rec.take() == []
    other, branch = recorder_with(filler_text("a", 2 * PAGE) + filler_text("b", PAGE))
    rec.learn(branch)
    rec.stored(branch[2][0], k1, PAGE)  # hangs under page 1, not under the last stored page
    (fork,) = rec.take()
    assert isinstance(fork, BlockStored) and fork.parent_block_hash == h1 and fork.block_hashes == [branch[2][1]]
    assert other.take() == []


def test_removals_coalesce_and_a_clear_forgets_every_hash() -> None:
    rec, table = recorder_with(filler_text("r", 2 * PAGE))
    (k0, h0, _), (k1, h1, _) = table
    rec.stored(k0, 0, PAGE)
    rec.stored(k1, k0, PAGE)
    rec.take()
    rec.removed(k1, PAGE)
    rec.removed(k0, PAGE)
    rec.removed(999, PAGE)  # never published: nothing to remove
    assert [(type(e), e.block_hashes) for e in rec.take()] == [(BlockRemoved, [h1, h0])]
    rec.stored(k0, 0, PAGE)
    rec.cleared()
    rec.removed(k0, PAGE)  # already gone with the clear
    events = rec.take()
    assert [type(e) for e in events] == [BlockStored, AllBlocksCleared]


@contextmanager
def publisher(**cfg: Any) -> Iterator[tuple[ZmqPublisher, str, str]]:
    port, replay = free_port(), free_port()
    pub = ZmqPublisher(
        KVEventsConfig(publisher="zmq", endpoint=f"tcp://*:{port}", replay_endpoint=f"tcp://*:{replay}", **cfg), 0
    )
    try:
        yield pub, f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}"
    finally:
        pub.shutdown()


def sent(pub: ZmqPublisher, n: int) -> None:
    deadline = time.monotonic() + 3
    while pub.seq < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pub.seq == n


def replay(endpoint: str, start: int) -> list[list[bytes]]:
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart([b"", seq_bytes(start)])
        frames = []
        while dealer.poll(2000):
            msg = dealer.recv_multipart()
            frames.append(msg)
            if msg[2] == END_SEQ:
                break
        return frames
    finally:
        dealer.close(linger=0)


def stored(h: int) -> BlockStored:
    return BlockStored(block_hashes=[h], parent_block_hash=None, token_ids=[1], block_size=1, lora_id=None)


def test_the_replay_answers_from_its_buffer_and_ends_with_the_marker() -> None:
    with publisher(topic="kv", buffer_steps=3) as (pub, _, replay_ep):
        for h in range(5):
            pub.publish(KVEventBatch(ts=1.0, events=[stored(h)]))
        sent(pub, 5)
        frames = replay(replay_ep, 0)  # only the last 3 are kept
        assert [seq_of(f[2]) for f in frames] == [2, 3, 4, -1]
        assert all(f[0] == b"" and f[1] == b"kv" for f in frames[:-1]) and frames[-1] == [b"", b"", END_SEQ, b""]
        batches = [decode_batch(f[3]) for f in frames[:-1]]
        assert [b.events[0].block_hashes for b in batches] == [[2], [3], [4]]
        assert {b.attn_dp_rank for b in batches} == {0}  # the publisher's rank, filled in
        assert [seq_of(f[2]) for f in replay(replay_ep, 4)] == [4, -1]
        assert [seq_of(f[2]) for f in replay(replay_ep, 9)] == [-1]


def test_live_frames_and_a_message_dropped_on_the_wire_but_kept_for_replay() -> None:
    with publisher(topic="kv") as (pub, pub_ep, replay_ep):
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub_ep)
        try:
            joined = None
            for _ in range(100):  # the slow joiner: publish until one arrives
                pub.publish(KVEventBatch(ts=1.0, events=[stored(0)]))
                if sub.poll(20):
                    joined = seq_of(sub.recv_multipart()[1])
                    break
            assert joined is not None
            while sub.poll(50):
                sub.recv_multipart()
            n = pub.seq
            pub.drop_next()
            pub.publish(KVEventBatch(ts=1.0, events=[stored(1)]))
            pub.publish(KVEventBatch(ts=1.0, events=[stored(2)]))
            assert sub.poll(2000)
            topic, seq, payload = sub.recv_multipart()
            assert (topic, seq_of(seq), decode_batch(payload).events[0].block_hashes) == (b"kv", n + 1, [2])
            assert [seq_of(f[2]) for f in replay(replay_ep, n)] == [n, n + 1, -1]  # the lost one is there
        finally:
            sub.close(linger=0)


def test_the_twins_engine_publishes_what_its_cache_stores_and_evicts() -> None:
    port, replay_port = free_port(), free_port()
    cfg = KVEventsConfig(publisher="zmq", endpoint=f"tcp://*:{port}", replay_endpoint=f"tcp://*:{replay_port}")
    engine = Engine(get_profile("tiny"), kv_tokens=64)
    events = TwinEvents(cfg, 16, engine._ranks)
    try:
        text = filler_text("conv", 40)  # two whole pages of 16 and a partial one
        blocks = text_blocks(text, 16)
        events.learn(None, text, blocks)
        engine.submit(EngineRequest("r", blocks, 1, 1, final_blocks=blocks), 0.0)
        engine.advance(1e9)
        events.flush()
        other = filler_text("other", 48)
        events.learn(0, other, text_blocks(other, 16))
        engine.submit(EngineRequest("o", text_blocks(other, 16), 1, 1, final_blocks=text_blocks(other, 16)), 10.0)
        engine.advance(1e9)  # 48 more tokens in a 64-token pool: the first conversation is evicted
        events.flush()
        sent(events.publishers[0], 2)
        got = [decode_batch(f[3]).events for f in replay(f"tcp://127.0.0.1:{replay_port}", 0)[:-1]]
        first = page_table(text, blocks, 16)
        assert len(got) == 2
        assert [(type(e), e.block_hashes) for e in got[0]] == [(BlockStored, [h for _, h, _ in first])]
        removed = [h for e in got[1] if isinstance(e, BlockRemoved) for h in e.block_hashes]
        assert set(removed) <= {h for _, h, _ in first} and removed
    finally:
        events.shutdown()

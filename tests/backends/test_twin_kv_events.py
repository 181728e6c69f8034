"""The twin publishes SGLang 0.5.23's KV events: checked with SGLang's own classes and publisher."""

from __future__ import annotations

import dataclasses
import json
import struct
import time
from typing import Any

import httpx
import pytest

zmq = pytest.importorskip("zmq", reason="pyzmq is the kv-events extra (pulled in by [dev])")

from backends.kv_wire import BlockRemoved, BlockStored, KVEventBatch, decode_batch, encode_batch  # noqa: E402
from backends.sim.chat_template import render_chat  # noqa: E402
from backends.sim.profiles import get_profile  # noqa: E402
from backends.sim.sglang_ref import load_kv_events  # noqa: E402
from backends.sim.testing import free_port, run_twin  # noqa: E402
from policies.engine_blocks import token_block_hashes  # noqa: E402

sg = load_kv_events()
SG_DECODER = __import__("msgspec").msgpack.Decoder(sg.KVEventBatch)


def _config(port: int, replay: int | None = None, topic: str = "kv-events") -> str:
    cfg: dict[str, Any] = {"publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": topic}
    if replay is not None:
        cfg["replay_endpoint"] = f"tcp://*:{replay}"
    return json.dumps(cfg)


def _sub(ctx: Any, port: int) -> Any:
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(f"tcp://127.0.0.1:{port}")
    return s


def _recv_all(sock: Any, until: float, want: int = 1) -> list[list[bytes]]:
    out: list[list[bytes]] = []
    deadline = time.monotonic() + until
    while time.monotonic() < deadline:
        if sock.poll(50):
            out.append(sock.recv_multipart())
            if len(out) >= want and not sock.poll(200):
                break
    return out


def _chat(url: str, content: str, max_tokens: int = 8) -> dict[str, Any]:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_wire_format_round_trips_with_sglangs_classes() -> None:
    ours = KVEventBatch(
        ts=1.5,
        events=[
            BlockStored(
                block_hashes=[1, -2], parent_block_hash=None, token_ids=[3, 4], block_size=1, lora_id=None, medium="GPU"
            ),
            BlockRemoved(block_hashes=[7], medium="GPU"),
        ],
        attn_dp_rank=0,
    )
    theirs = SG_DECODER.decode(encode_batch(ours))
    assert [type(e).__name__ for e in theirs.events] == ["BlockStored", "BlockRemoved"]
    assert theirs.events[0].block_hashes == [1, -2] and theirs.events[0].medium == "GPU"
    back = sg.KVEventBatch(ts=2.0, events=[sg.AllBlocksCleared()], attn_dp_rank=3)
    enc = __import__("msgspec").msgpack.Encoder()
    assert encode_batch(decode_batch(enc.encode(back))) == enc.encode(back)


def test_framing_matches_sglangs_own_publisher() -> None:
    """SGLang's ZmqEventPublisher and the twin's publisher frame a batch the same way."""
    from backends.kv_wire import KVEventsConfig
    from backends.sim.kv_publisher import ZmqPublisher

    ctx = zmq.Context.instance()
    frames = []
    for make in ("sglang", "twin"):
        port = free_port()
        sub = _sub(ctx, port)
        if make == "sglang":
            pub: Any = sg.ZmqEventPublisher(attn_dp_rank=0, endpoint=f"tcp://*:{port}", topic="t")
        else:
            pub = ZmqPublisher(KVEventsConfig(publisher="zmq", endpoint=f"tcp://*:{port}", topic="t"), 0)
        time.sleep(0.3)  # the slow joiner
        batch_cls = sg.KVEventBatch if make == "sglang" else KVEventBatch
        stored_cls = sg.BlockStored if make == "sglang" else BlockStored
        ev = stored_cls(block_hashes=[5], parent_block_hash=None, token_ids=[1], block_size=1, lora_id=None)
        pub.publish(batch_cls(ts=1.0, events=[ev]))
        got = _recv_all(sub, 3.0)
        pub.shutdown()
        sub.close(linger=0)
        assert got, make
        frames.append(got[0])
    assert frames[0] == frames[1]  # topic, seq 0 (8 bytes big-endian), identical msgpack payload
    assert frames[0][1] == (0).to_bytes(8, "big")


def test_twin_publishes_sglang_events_with_sglang_hashes() -> None:
    port, replay = free_port(), free_port()
    ctx = zmq.Context.instance()
    sub = _sub(ctx, port)
    with run_twin("tiny", time_scale=0.05, kv_events_config=_config(port, replay)) as url:
        time.sleep(0.3)
        text = "def f(x):\n    return x * 2\n" * 40
        _chat(url, text)
        msgs = _recv_all(sub, 5.0)
        assert msgs
        topic, seq, _ = msgs[0]
        assert topic == b"kv-events" and seq == (0).to_bytes(8, "big")
        batches = [SG_DECODER.decode(m[2]) for m in msgs]
        assert [int.from_bytes(m[1], "big") for m in msgs] == list(range(len(msgs)))
        stored = [e for b in batches for e in b.events if isinstance(e, sg.BlockStored)]
        assert stored and all(b.attn_dp_rank == 0 for b in batches)
        page = get_profile("tiny").page_size
        prompt = render_chat([{"role": "user", "content": text}]).encode()
        full = len(prompt) // (4 * page) * (4 * page)
        ids = list(struct.unpack(f"<{full // 4}I", prompt[:full]))
        want = token_block_hashes(ids, page)
        hashes = [h for e in stored for h in e.block_hashes]
        assert hashes[: len(want)] == want  # the prompt's pages, then the answer's whole pages
        assert stored[0].parent_block_hash is None and stored[0].token_ids[: 4 * page] == ids[: 4 * page]
        assert all(e.block_size == page and len(e.token_ids) == page * len(e.block_hashes) for e in stored)

        # the replay endpoint answers every buffered message, then the end marker
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{replay}")
        dealer.send_multipart((b"", (0).to_bytes(8, "big")))
        replayed = []
        while dealer.poll(3000):
            frames = dealer.recv_multipart()
            if frames[2] == sg.ZmqEventPublisher.END_SEQ:
                break
            replayed.append(frames[1:])
        dealer.close(linger=0)
        assert replayed == msgs

        r = httpx.post(f"{url}/flush_cache", timeout=10)
        assert r.status_code == 200
        cleared = _recv_all(sub, 5.0)
        assert any(isinstance(e, sg.AllBlocksCleared) for m in cleared for e in SG_DECODER.decode(m[2]).events)
    sub.close(linger=0)


def test_eviction_publishes_block_removed() -> None:
    port = free_port()
    ctx = zmq.Context.instance()
    sub = _sub(ctx, port)
    with run_twin("tiny", time_scale=0.02, kv_tokens=4096, kv_events_config=_config(port)) as url:
        time.sleep(0.3)
        for i in range(4):  # 4 × ~1.6k tokens in a 4k pool: the first ones are evicted
            _chat(url, f"conversation {i} " + "y" * 6400)
        msgs = _recv_all(sub, 5.0, want=3)
    sub.close(linger=0)
    events = [e for m in msgs for e in SG_DECODER.decode(m[2]).events]
    stored = {h for e in events if isinstance(e, sg.BlockStored) for h in e.block_hashes}
    removed = [h for e in events if isinstance(e, sg.BlockRemoved) for h in e.block_hashes]
    assert removed and set(removed) <= stored


def test_one_port_per_dp_rank() -> None:
    prof = dataclasses.replace(get_profile("tiny"), dp_size=2)
    base = free_port()
    while True:  # base and base + 1 both free
        try:
            probe = zmq.Context.instance().socket(zmq.PUB)
            probe.bind(f"tcp://127.0.0.1:{base + 1}")
            probe.close(linger=0)
            break
        except zmq.ZMQError:
            base = free_port()
    ctx = zmq.Context.instance()
    subs = [_sub(ctx, base), _sub(ctx, base + 1)]
    got: list[list[list[bytes]]] = [[], []]
    with run_twin(prof, time_scale=0.05, kv_events_config=_config(base)) as url:
        # A SUB socket joins late (ZMQ drops what was published before it connected): keep sending
        # a turn to each rank until each subscriber has heard its own rank, for at most 20 s.
        deadline = time.monotonic() + 20
        i = 0
        while not all(got) and time.monotonic() < deadline:
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": f"rank test {i} " + "z" * 400}],
                "max_tokens": 4,
                "routed_dp_rank": i % 2,
            }
            assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).status_code == 200
            i += 1
            for rank, sub in enumerate(subs):
                got[rank] += _recv_all(sub, 0.3)
    for s in subs:
        s.close(linger=0)
    for rank, msgs in enumerate(got):
        assert msgs, rank
        assert {SG_DECODER.decode(m[2]).attn_dp_rank for m in msgs} == {rank}

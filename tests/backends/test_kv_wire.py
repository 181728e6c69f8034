"""``backends/kv_wire.py``: SGLang 0.5.23's KV event wire format as defined here: a batch is a positional
msgpack array, each event a map tagged by its class name with defaults omitted; sequence frames are
8 bytes big-endian; ``--kv-events-config`` parses as SGLang's; rank r's endpoint is port + r. (The
twin's suite checks the same bytes against SGLang's own classes: tests/backends/test_twin_kv_events.py.)"""

from __future__ import annotations

import msgspec
import pytest
from pydantic import ValidationError

from backends.kv_wire import (
    END_SEQ,
    GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventsConfig,
    decode_batch,
    encode_batch,
    offset_endpoint_port,
    seq_bytes,
    seq_of,
)


def stored(**kw: object) -> BlockStored:
    fields: dict[str, object] = dict(block_hashes=[1, -2], parent_block_hash=None, token_ids=[3, 4], block_size=2)
    return BlockStored(**{**fields, "lora_id": None, **kw})  # type: ignore[arg-type]


def test_a_batch_round_trips_with_every_event_kind() -> None:
    batch = KVEventBatch(
        ts=1.5,
        events=[stored(medium=GPU), BlockRemoved(block_hashes=[7]), AllBlocksCleared()],
        attn_dp_rank=3,
    )
    back = decode_batch(encode_batch(batch))
    assert back == batch
    assert [type(e) for e in back.events] == [BlockStored, BlockRemoved, AllBlocksCleared]
    assert back.events[0].medium == "GPU" and back.events[1].medium is None


def test_the_layout_is_a_positional_array_of_tagged_maps_without_defaults() -> None:
    raw = msgspec.msgpack.decode(encode_batch(KVEventBatch(ts=2.0, events=[stored(), BlockRemoved(block_hashes=[9])])))
    ts, events, rank = raw
    assert (ts, rank) == (2.0, None)
    assert events[0] == {
        "type": "BlockStored",
        "block_hashes": [1, -2],
        "parent_block_hash": None,  # required fields are written even when null
        "token_ids": [3, 4],
        "block_size": 2,
        "lora_id": None,
    }  # medium, cache_salt, session_id, lora_name left at their default: omitted
    assert events[1] == {"type": "BlockRemoved", "block_hashes": [9]}
    # a batch written without the rank (older publishers) decodes with rank None
    assert decode_batch(msgspec.msgpack.encode([1.0, []])).attn_dp_rank is None


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # never-used msgpack byte
        msgspec.msgpack.encode({"ts": 1.0, "events": []}),  # a map, not the positional array
        msgspec.msgpack.encode([1.0, [{"type": "BlockMoved", "block_hashes": [1]}]]),  # unknown tag
        msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved"}]]),  # a required field missing
    ],
)
def test_a_payload_that_is_not_a_batch_raises_msgspecs_errors(payload: bytes) -> None:
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        decode_batch(payload)


def test_sequence_frames() -> None:
    assert seq_bytes(0) == b"\x00" * 8 and seq_bytes(258) == b"\x00" * 6 + b"\x01\x02"
    assert seq_of(seq_bytes(2**40 + 5)) == 2**40 + 5
    assert seq_of(END_SEQ) == -1 and END_SEQ == b"\xff" * 8  # the replay's end marker is signed -1


def test_the_cli_config_has_sglangs_defaults_and_refuses_what_sglang_refuses() -> None:
    cfg = KVEventsConfig.from_cli('{"publisher": "zmq", "endpoint": "tcp://*:6000", "topic": "kv"}')
    assert (cfg.publisher, cfg.endpoint, cfg.replay_endpoint, cfg.topic) == ("zmq", "tcp://*:6000", None, "kv")
    assert (cfg.buffer_steps, cfg.hwm, cfg.max_queue_size, cfg.bind) == (10_000, 100_000, 100_000, None)
    assert KVEventsConfig.from_cli("{}").publisher == "null"
    with pytest.raises(ValueError, match="Unknown event publisher 'kafka'"):
        KVEventsConfig.from_cli('{"publisher": "kafka"}')
    with pytest.raises(ValidationError):
        KVEventsConfig.from_cli('{"publisher": "zmq", "endpiont": "tcp://*:1"}')
    with pytest.raises(ValueError):
        KVEventsConfig.from_cli("not json")


def test_each_rank_offsets_the_endpoint_as_sglang_does() -> None:
    assert offset_endpoint_port("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint_port("tcp://*:5557", 3) == "tcp://*:5560"
    assert offset_endpoint_port("tcp://[::1]:5557", 1) == "tcp://[::1]:5558"
    assert offset_endpoint_port("inproc://kv", 2) == "inproc://kv_dp2"
    assert offset_endpoint_port(None, 2) is None and offset_endpoint_port("", 2) == ""
    with pytest.raises(ValueError, match="must contain 'inproc' or 'tcp'"):
        offset_endpoint_port("ipc:///tmp/kv", 1)

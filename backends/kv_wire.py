"""SGLang 0.5.23's KV event wire format (``srt/disaggregation/kv_events.py``), defined here, not imported.

A message on the PUB socket is three frames: ``topic`` (the config's ``topic``, UTF-8, default empty),
the sequence number (8 bytes, big-endian, from 0 per publisher), and the payload: a msgpack
``KVEventBatch``, a positional array ``[ts, events, attn_dp_rank]``; each event is a msgpack map tagged
by its class name under ``type`` (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``), with
optional fields left at their default omitted. The replay endpoint is a ROUTER: a client (DEALER/REQ)
sends ``[b"", start_seq (8 bytes big-endian)]`` and gets every buffered message with ``seq >= start`` as
``[b"", topic, seq, payload]``, then ``[b"", b"", seq -1 (signed), b""]``.

Only ``msgspec`` is needed here (the ZMQ sockets live in ``backends/sim/kv_publisher.py`` and
``backends/kv_events.py``); the tests decode our messages with SGLang's own classes.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from pydantic import BaseModel, ConfigDict

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay's end marker (``ZmqEventPublisher.END_SEQ``)."""


class EventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Any]
    attn_dp_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Tagged by class name (``type``), optional fields omitted: SGLang's and vLLM's encoding."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(EventBatch):
    events: list[KVEvent]


GPU = "GPU"
"""``StorageMedium.GPU``: the device tier (the only one the gateway routes on)."""

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    return _encoder.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """Raises ``msgspec.DecodeError`` / ``ValidationError`` on a payload that is not a batch."""
    return _decoder.decode(payload)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def seq_of(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)


class KVEventsConfig(BaseModel):
    """SGLang's ``--kv-events-config`` JSON (``KVEventsConfig``): the fields and defaults of 0.5.23."""

    model_config = ConfigDict(extra="forbid")
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    bind: bool | None = None
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    format: str = "default"

    @classmethod
    def from_cli(cls, value: str) -> KVEventsConfig:
        cfg = cls.model_validate(json.loads(value))
        if cfg.publisher not in ("null", "zmq"):
            raise ValueError(f"Unknown event publisher '{cfg.publisher}'")
        return cfg


def offset_endpoint_port(endpoint: str | None, rank: int) -> str | None:
    """Rank ``r`` publishes on ``port + r`` (``inproc``: a ``_dp{r}`` suffix), as SGLang does."""
    if not endpoint or rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{rank}"
    if "tcp" in endpoint and ":" in endpoint:
        base, port = endpoint.rsplit(":", 1)
        return f"{base}:{int(port) + rank}"
    raise ValueError("Invalid endpoint: must contain 'inproc' or 'tcp'")


__all__ = [
    "END_SEQ",
    "GPU",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVEvent",
    "KVEventBatch",
    "KVEventsConfig",
    "decode_batch",
    "encode_batch",
    "offset_endpoint_port",
    "seq_bytes",
    "seq_of",
]

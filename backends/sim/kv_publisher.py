"""The twin's KV events: SGLang 0.5.23's ``ZmqEventPublisher`` pattern, fed by the twin's radix cache.

``--kv-events-config '{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint":
"tcp://*:5558", "topic": "kv-events"}'`` (SGLang's flag and JSON) starts one publisher per DP rank on
``port + rank`` (the replay ROUTER too). Each publisher owns a PUB socket and, when configured, a
ROUTER replay socket serviced by its own thread, with the last ``buffer_steps`` messages kept for
replay; messages are ``(topic, seq, payload)`` with ``seq`` counting from 0 (``backends/kv_wire.py``).

``RankRecorder`` is the radix cache's observer (``backends/sim/radix.py::CacheObserver``): it turns the
twin's block keys into SGLang's block hashes (``policies/engine_blocks.py``: the twin's token is 4 bytes
of UTF-8, so its token ids packed as uint32 are the text's bytes) and coalesces them as SGLang's
``KVCacheEventRecorder.enqueue`` does. Only whole pages are published, as SGLang caches only whole
pages; the twin's partial last block stays unpublished. Needs ``pyzmq`` (the ``kv-events`` extra).
"""

from __future__ import annotations

import logging
import queue
import struct
import threading
import time
from typing import Any

from backends.kv_wire import (
    END_SEQ,
    GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
    KVEventsConfig,
    encode_batch,
    offset_endpoint_port,
    seq_bytes,
)
from backends.sim.tokenizer import BYTES_PER_TOKEN, Block
from policies.engine_blocks import digest_to_block_hash, page_digests

log = logging.getLogger("cachegate.sim.kv_events")


def require_zmq() -> Any:
    try:
        import zmq
    except ImportError as exc:  # the extra is optional: say which one
        raise RuntimeError("KV events need pyzmq: pip install 'cachegate[kv-events]'") from exc
    return zmq


class ZmqPublisher:
    """PUB + optional ROUTER replay for one rank; ``publish`` is thread-safe and never blocks."""

    def __init__(self, cfg: KVEventsConfig, rank: int) -> None:
        zmq = require_zmq()
        self.rank = rank
        self.endpoint = offset_endpoint_port(cfg.endpoint, rank) or cfg.endpoint
        self.replay_endpoint = offset_endpoint_port(cfg.replay_endpoint, rank)
        self._topic = cfg.topic.encode()
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue(maxsize=cfg.max_queue_size)
        self._buffer: list[tuple[int, bytes]] = []
        self._buffer_steps = cfg.buffer_steps
        self._seq = 0
        self._drop = False
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(cfg.hwm)
        bind = cfg.bind
        if bind is None:
            bind = any(w in self.endpoint for w in ("*", "::", "0.0.0.0")) or self.endpoint.startswith(
                ("ipc://", "inproc://")
            )
        if bind:
            self._pub.bind(self.endpoint)
        else:
            self._pub.connect(self.endpoint)
        self._replay = None
        if self.replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.bind(self.replay_endpoint)
        self._running = True
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"kv-publisher-{rank}")
        self._thread.start()

    @property
    def seq(self) -> int:
        """The next sequence number (tests drop one to make a gap)."""
        return self._seq

    def drop_next(self) -> None:
        """Buffer the next message for replay but do not send it (lost on the wire; fault tests)."""
        self._drop = True

    def publish(self, batch: KVEventBatch) -> None:
        if batch.attn_dp_rank is None:
            batch.attn_dp_rank = self.rank
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            log.warning("kv event queue full on rank %d: batch dropped", self.rank)

    def _run(self) -> None:
        while self._running or not self._queue.empty():
            if self._replay is not None and self._replay.poll(0):
                self._service_replay()
            try:
                batch = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if batch is None:
                continue
            seq = self._seq
            self._seq += 1
            payload = encode_batch(batch)
            try:
                if self._drop:
                    self._drop = False
                else:
                    self._pub.send_multipart((self._topic, seq_bytes(seq), payload))
            except Exception:  # a send error must not kill the publisher (SGLang logs and goes on)
                log.exception("kv event publish failed")
            self._buffer.append((seq, payload))
            if len(self._buffer) > self._buffer_steps:
                del self._buffer[: len(self._buffer) - self._buffer_steps]

    def _service_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            log.warning("invalid replay request: %d frames", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in self._buffer:
            if seq >= first:
                self._replay.send_multipart((client, b"", self._topic, seq_bytes(seq), payload))
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

    def shutdown(self) -> None:
        self._running = False
        self._queue.put(None)
        self._thread.join(timeout=2.0)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)


def page_table(text: str, blocks: list[Block], page_size: int) -> list[tuple[int, int, bytes]]:
    """(twin key, SGLang block hash, bytes) of each whole page of ``text`` (``blocks`` =
    ``text_blocks(text, page_size)``): the twin's token ids packed as uint32 are the text's bytes."""
    data = text.encode()
    step = page_size * BYTES_PER_TOKEN
    keys: list[int] = []
    pages: list[bytes] = []
    for i, (key, n) in enumerate(blocks):
        chunk = data[i * step : (i + 1) * step]
        if n != page_size or len(chunk) != step:
            break  # only the last block can be partial
        keys.append(key)
        pages.append(chunk)
    return [(key, digest_to_block_hash(d), p) for key, d, p in zip(keys, page_digests(pages), pages, strict=True)]


class RankRecorder:
    """One rank's radix observer: twin block keys → SGLang block hashes, coalesced into events."""

    def __init__(self, page_size: int) -> None:
        self.page = page_size
        self._pages: dict[int, tuple[int, bytes]] = {}
        """Twin key of a whole page → (SGLang block hash, its bytes): learned from each request's text."""
        self._hash: dict[int, int] = {}
        """Twin key of a resident published page → its block hash (for ``BlockRemoved``)."""
        self._queue: list[KVEvent] = []

    def learn(self, table: list[tuple[int, int, bytes]]) -> None:
        """Remember ``page_table``'s pages (a request's text) until they are stored or forgotten."""
        known = self._pages
        for key, block_hash, page in table:
            if key not in known:
                known[key] = (block_hash, page)
        if len(known) > 4 * len(self._hash) + 200_000:  # pages learned but never stored (aborted requests)
            self._pages = {k: v for k, v in known.items() if k in self._hash}

    # -- CacheObserver ---------------------------------------------------------------------------
    def stored(self, key: int, parent: int, ntok: int) -> None:
        page = self._pages.get(key)
        if page is None or ntok != self.page:
            return  # a partial page, or text the twin never saw as a request: SGLang would not cache it
        block_hash, data = page
        self._hash[key] = block_hash
        parent_hash = self._hash.get(parent) if parent else None
        tokens = list(struct.unpack(f"<{len(data) // 4}I", data))
        tail = self._queue[-1] if self._queue else None
        if isinstance(tail, BlockStored) and tail.block_hashes and parent_hash == tail.block_hashes[-1]:
            tail.block_hashes.append(block_hash)
            tail.token_ids.extend(tokens)
            return
        self._queue.append(
            BlockStored(
                block_hashes=[block_hash],
                parent_block_hash=parent_hash,
                token_ids=tokens,
                block_size=self.page,
                lora_id=None,
                medium=GPU,
            )
        )

    def removed(self, key: int, ntok: int) -> None:
        block_hash = self._hash.pop(key, None)
        if block_hash is None:
            return
        tail = self._queue[-1] if self._queue else None
        if isinstance(tail, BlockRemoved):
            tail.block_hashes.append(block_hash)
        else:
            self._queue.append(BlockRemoved(block_hashes=[block_hash], medium=GPU))

    def cleared(self) -> None:
        self._hash.clear()
        self._queue.append(AllBlocksCleared())

    def take(self) -> list[KVEvent]:
        events, self._queue = self._queue, []
        return events


class TwinEvents:
    """The twin's publishers and recorders, one per rank; ``flush`` after each engine advance."""

    def __init__(self, cfg: KVEventsConfig, page_size: int, ranks: list[Any]) -> None:
        self.recorders = [RankRecorder(page_size) for _ in ranks]
        self.publishers = [ZmqPublisher(cfg, i) for i in range(len(ranks))]
        for rk, rec in zip(ranks, self.recorders, strict=True):
            rk.cache.observer = rec

    def learn(self, rank: int | None, text: str, blocks: list[Block]) -> None:
        table = page_table(text, blocks, self.recorders[0].page)
        for i, rec in enumerate(self.recorders):
            if rank is None or rank == i:
                rec.learn(table)

    def flush(self) -> None:
        for rec, pub in zip(self.recorders, self.publishers, strict=True):
            events = rec.take()
            if events:
                pub.publish(KVEventBatch(ts=time.time(), events=events))

    def shutdown(self) -> None:
        for pub in self.publishers:
            pub.shutdown()

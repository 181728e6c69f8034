"""The gateway's exact cache view (gateway/state/kv_learn.py): built only where backends publish, said
clearly without pyzmq; fingerprint blocks mapped to engine blocks through a real twin's ``/v1/tokenize``
(``MappingLearner``: after a turn, before a new conversation is routed, at most ``pre_route_s``); the
view's status. Events followed from a live engine: tests/live/test_kv_events_live.py."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import pytest

import gateway.state.kv_learn as kv_learn
from backends.config import BackendConfig
from backends.sim.routes_tokenize import token_ids
from backends.sim.testing import run_twin
from policies import registry
from policies.engine_blocks import align_blocks, token_block_hashes
from policies.kv_view import PreciseIndex
from policies.prefix import BLOCK_BYTES, fingerprint
from policies.prefix_index import PrefixIndex
from policies.types import Fingerprint
from tests.fake_upstream import free_port


def _backends() -> list[BackendConfig]:
    return [
        BackendConfig(url="http://a:1", name="a", dp_size=2, kv_events={"endpoint": "tcp://a:5557"}),  # type: ignore[arg-type]
        BackendConfig(url="http://b:1", name="b"),
    ]


def test_precise_index_replaces_the_routers_and_one_subscriber_per_rank() -> None:
    core = registry.build("gateway")
    view = kv_learn.build_kv_view(core, _backends())
    assert view is not None and isinstance(core.router.index, PreciseIndex)  # type: ignore[attr-defined]
    assert [(s.backend, s.rank, s.endpoint) for s in view.follower.subscribers] == [
        ("a", 0, "tcp://a:5557"),
        ("a", 1, "tcp://a:5558"),
    ]
    assert set(view.index.mirrors) == {("a", 0), ("a", 1)}


def test_no_publishing_backend_no_view() -> None:
    core = registry.build("gateway")
    assert kv_learn.build_kv_view(core, [BackendConfig(url="http://b:1")]) is None
    assert type(core.router.index) is PrefixIndex  # type: ignore[attr-defined]


def test_without_pyzmq_the_gateway_says_so_and_stays_approximate(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(kv_learn, "zmq_available", lambda: False)
    core = registry.build("gateway")
    with caplog.at_level(logging.ERROR, logger="cachegate.kv_events"):
        assert kv_learn.build_kv_view(core, _backends()) is None
    assert "pip install 'cachegate[kv-events]'" in caplog.text and "a" in caplog.text
    assert type(core.router.index) is PrefixIndex  # type: ignore[attr-defined]


def test_kv_events_endpoint_must_be_tcp() -> None:
    with pytest.raises(ValueError, match="tcp://"):
        BackendConfig(url="http://a:1", kv_events={"endpoint": "ipc:///tmp/x"})  # type: ignore[arg-type]


def test_align_blocks_maps_each_block_a_page_early() -> None:
    fp = ((1, 256), (2, 256), (3, 100))  # 1024 + 1024 + 400 bytes
    hashes = list(range(100, 100 + 38))  # 612 tokens / 16 = 38 whole pages
    pairs = align_blocks(fp, 2448, 1024, 612, 16, hashes)
    # block 0 ends at byte 1024 = token 256 = page 16 (index 15); one page early: index 14
    assert pairs == [(1, 100 + 14), (2, 100 + 30), (3, 100 + 36)]
    assert align_blocks(fp, 0, 1024, 612, 16, hashes) == []


# ---- the mapping learned from the backend's own tokenizer ---------------------------------------------

PAGE = 16
PROMPT = "".join(f"line {i}: the same long system prompt every turn starts with.\n" for i in range(120))


@pytest.fixture(scope="module")
def twin() -> Iterator[str]:
    with run_twin("tiny") as url:
        yield url


def _view(url: str, wait_s: float = 0.5) -> kv_learn.KVView:
    """A gateway's view over one publishing backend at ``url``, whose events have said their block size
    (as a subscriber learns it from its first message); the subscriptions themselves are not started."""
    source = {"endpoint": "tcp://127.0.0.1:5557", "poll_s": 0.01, "tokenize_wait_s": wait_s}
    view = kv_learn.build_kv_view(registry.build("gateway"), [BackendConfig(url=url, name="a", kv_events=source)])  # type: ignore[arg-type]
    assert view is not None
    view.follower.subscribers[0].block_size = PAGE
    return view


def _expected(prompt: str) -> tuple[Fingerprint, list[tuple[int, int]]]:
    """The fingerprint of ``prompt`` and the pairs the twin's tokenization gives it (the twin's token is
    4 bytes, its id those bytes: backends/sim/routes_tokenize.py)."""
    data = prompt.encode()
    fp = fingerprint(data, 0.25)
    tokens = token_ids(prompt)
    return fp, align_blocks(fp, len(data), BLOCK_BYTES, len(tokens), PAGE, token_block_hashes(tokens, PAGE))


async def test_learn_maps_fingerprint_blocks_to_the_engines_blocks(twin: str) -> None:
    view = _view(twin)
    learner = view.learner
    fp, pairs = _expected(PROMPT)
    assert len(pairs) >= 5
    learner.start()
    try:
        await learner.learn("a", {"prompt": PROMPT}, fp, len(PROMPT.encode()))
    finally:
        await learner.stop()
    assert learner.learned == len(pairs) == len(view.index.block_map)
    assert all(view.index.block_map.get(key) == engine for key, engine in pairs)
    status = view.status()
    assert status["mapped_blocks"] == len(pairs) and status["tokenized"]["learned_pairs"] == len(pairs)
    assert status["ranks"] == {"a@0": {"state": "new", "blocks": 0, "messages": 0, "transitions": 0}}, "no event yet"


async def test_observe_queues_only_what_is_not_known_and_the_loop_learns_it(twin: str) -> None:
    view = _view(twin)
    learner = view.learner
    fp, pairs = _expected(PROMPT)
    body, size = {"prompt": PROMPT}, len(PROMPT.encode())
    learner.observe("elsewhere", body, fp, size)  # a backend that does not publish
    learner.observe("a", body, (), size)  # nothing to learn
    assert learner._queue.qsize() == 0
    learner.start()
    try:
        learner.observe("a", body, fp, size)
        deadline = time.monotonic() + 2
        while learner.learned < len(pairs) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert learner.learned == len(pairs)
        learner.observe("a", body, fp, size)  # its last block is mapped now: not asked again
        assert learner._queue.qsize() == 0
        learner.observe("a", {"messages": "not a list"}, _expected(PROMPT + "more")[0], size)  # the twin says 400
        deadline = time.monotonic() + 2
        while learner.failed < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert learner.failed == 1, "a tokenize that fails teaches nothing, and the loop goes on"
    finally:
        await learner.stop()


async def test_observe_drops_what_does_not_fit_the_queue() -> None:
    view = _view("http://127.0.0.1:9")
    learner = kv_learn.MappingLearner(view.index.block_map, view.follower, view.learner.backends, queue=1)
    for text in ("one", "two"):
        fp, _ = _expected(PROMPT + text)
        learner.observe("a", {"prompt": PROMPT + text}, fp, len(PROMPT) + 3)  # never blocks
    assert learner._queue.qsize() == 1


async def test_a_new_conversation_is_learned_before_it_is_routed(twin: str) -> None:
    view = _view(twin)
    learner = view.learner
    fp, pairs = _expected(PROMPT)
    body, size = {"prompt": PROMPT}, len(PROMPT.encode())
    learner.start()
    try:
        await learner.before_route(body, fp, size)
        assert (learner.pre_route, learner.pre_route_missed, learner.learned) == (1, 0, len(pairs))
        await learner.before_route(body, fp, size)  # known now: routed at once
        assert learner.pre_route == 1
    finally:
        await learner.stop()


async def test_a_slow_or_missing_tokenizer_costs_a_new_conversation_at_most_the_wait() -> None:
    down = _view(f"http://127.0.0.1:{free_port()}", wait_s=0.1)
    learner = down.learner
    fp, _ = _expected(PROMPT)
    learner.start()
    try:
        t0 = time.monotonic()
        await learner.before_route({"prompt": PROMPT}, fp, len(PROMPT.encode()))
        assert time.monotonic() - t0 < 0.5
        assert (learner.pre_route, learner.pre_route_missed, learner.learned) == (1, 1, 0)
    finally:
        await learner.stop()
    off = _view("http://127.0.0.1:9", wait_s=0)
    await off.learner.before_route({"prompt": PROMPT}, fp, len(PROMPT.encode()))
    assert off.learner.pre_route == 0, "tokenize_wait_s: 0: learned after the turn only"


async def test_a_backend_whose_events_said_nothing_yet_is_skipped(twin: str) -> None:
    view = _view(twin)
    view.follower.subscribers[0].block_size = None  # no event seen: the page size is unknown
    learner = view.learner
    fp, _ = _expected(PROMPT)
    learner.start()
    try:
        await learner.learn("a", {"prompt": PROMPT}, fp, len(PROMPT.encode()))  # polls 3 × poll_s, then gives up
        assert (learner.skipped, learner.learned) == (1, 0)
        await learner.before_route({"prompt": PROMPT}, fp, len(PROMPT.encode()))
        assert learner.pre_route == 0, "no backend to ask"
    finally:
        await learner.stop()

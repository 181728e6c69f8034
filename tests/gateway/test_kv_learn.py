"""The gateway's exact cache view: built only where backends publish, said clearly without pyzmq."""

from __future__ import annotations

import logging

import pytest

import gateway.state.kv_learn as kv_learn
from backends.config import BackendConfig
from policies import registry
from policies.engine_blocks import align_blocks
from policies.kv_view import PreciseIndex
from policies.prefix_index import PrefixIndex


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

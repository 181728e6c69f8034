"""Shared fixtures: Redis (the machine's, or a private server a test may stop)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
import redis

from loadtest.bench.procs import RedisServer

SHARED_REDIS = os.environ.get("CACHEGATE_TEST_REDIS", "redis://127.0.0.1:6379/9")


def _need_redis(reason: str) -> None:
    if os.environ.get("REQUIRE_REDIS") == "1":
        pytest.fail(f"REQUIRE_REDIS=1 but {reason}")
    pytest.skip(f"SKIPPED FOR LACK OF REDIS ({reason}); CI sets REQUIRE_REDIS=1 and runs these")


@pytest.fixture()
def redis_url() -> Iterator[str]:
    """The shared Redis, database 9, emptied of this test's keys before and after."""
    client = redis.Redis.from_url(SHARED_REDIS, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        _need_redis(f"Redis at {SHARED_REDIS} is unreachable: {exc}")
    prefix_keys = lambda: client.keys("cachegate:*")  # noqa: E731
    for key in prefix_keys():
        client.delete(key)
    yield SHARED_REDIS
    for key in prefix_keys():
        client.delete(key)
    client.close()


@pytest.fixture()
def redis_server() -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        _need_redis("redis-server is not installed")
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.remove()

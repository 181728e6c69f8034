"""Shared fixtures: Redis (the machine's, or a private server a test may stop)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest
import redis

from tests.fake_upstream import free_port

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


class RedisServer:
    """A private ``redis-server`` on a free port, which a test may stop and start again."""

    def __init__(self) -> None:
        if shutil.which("redis-server") is None:
            _need_redis("redis-server is not installed")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="cg-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis.RedisError):
                if client.ping():
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("private redis-server did not start")
            time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=0.5)


@pytest.fixture()
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)

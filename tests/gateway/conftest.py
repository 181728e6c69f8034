"""Fixtures of the gateway's tests: the scripted upstream most of them put the gateway in front of."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fake_upstream import FakeUpstream


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    """One ``FakeUpstream`` per test module (a module may define its own ``upstream`` instead)."""
    up = FakeUpstream()
    with up.running():
        yield up

"""``quiet_gc`` (gateway/http/gcpause.py): a served worker freezes its start-up objects; any other process
that starts the app (tests) keeps its collector as it was."""

from __future__ import annotations

import gc

import pytest

from gateway.http.gcpause import ENV, THRESHOLDS, quiet_gc


def test_only_a_served_process_freezes(monkeypatch: pytest.MonkeyPatch) -> None:
    before = gc.get_threshold()
    monkeypatch.delenv(ENV, raising=False)
    quiet_gc()
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
    monkeypatch.setenv(ENV, "1")
    try:
        quiet_gc()
        assert gc.get_freeze_count() > 1000, "the start-up objects left the collected generations"
        assert gc.get_threshold() == THRESHOLDS
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)

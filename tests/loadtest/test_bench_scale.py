"""``cachegate bench --scaling --cpu-quota``: the cgroup that caps a worker really caps it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadtest.bench.scale import CGROUP_CPU, CgroupUnavailable, cpu_limit, cpu_seconds, workers_of


def test_a_directory_that_is_no_cgroup_is_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(CgroupUnavailable, match="cannot apply a CPU quota"), cpu_limit("x", 0.2, root=tmp_path):
        pass


def test_a_busy_process_in_the_quota_group_gets_its_quota_and_the_group_is_removed() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert workers_of(busy.pid, 1) == [busy.pid]
        with cpu_limit("cachegate-test-quota", 0.2) as group:  # CgroupUnavailable where none is writable
            group.add(busy.pid)
            c0, t0 = cpu_seconds(busy.pid), time.monotonic()
            time.sleep(1.0)
            share = (cpu_seconds(busy.pid) - c0) / (time.monotonic() - t0)
            throttled = group.throttled()
        assert throttled > 0 and 0.05 < share < 0.3, (throttled, share)  # 0.2 CPU; unthrottled it takes 1.0
        assert not group.path.exists()  # removed, the process moved back to the root group
        assert str(busy.pid) in (CGROUP_CPU / "cgroup.procs").read_text().split()
    finally:
        busy.kill()
        busy.wait()

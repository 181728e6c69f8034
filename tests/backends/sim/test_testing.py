"""backends/sim/testing.py: the helpers that start twins for tests: a free port, waiting for ``/health``
(and giving up on a timeout or on a dead process, with its log: how ``spawn_twin`` reports a
``sim-backend`` that dies at start), in-process twins on uvicorn threads and the :class:`Twin` behind
each URL, and a port that cannot be bound. ``spawn_twin`` itself starts a process:
tests/backends/test_twin_api.py::test_sim_backend_process."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time

import httpx
import pytest

from backends.sim.testing import free_port, run_twin, run_twins, twin_of, wait_ready


def test_free_port_can_be_bound() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_wait_ready_gives_up_when_nothing_answers() -> None:
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"not ready after 0\.1s \(last: ConnectError"):
        wait_ready(f"http://127.0.0.1:{free_port()}", timeout=0.1)
    assert time.monotonic() - t0 < 2.0


def test_wait_ready_reports_a_process_that_exited_with_its_log() -> None:
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stderr.write('no GPU'); sys.exit(3)"], stderr=log
        )
        proc.wait()
        with pytest.raises(RuntimeError, match="twin process exited with 3: no GPU"):
            wait_ready(f"http://127.0.0.1:{free_port()}", timeout=5, proc=proc, log=log)


def test_run_twins_serve_twins_and_give_their_twin_objects_until_the_block_ends() -> None:
    with run_twins(2, "tiny", time_scale=0.02, model="m-1") as urls:
        assert len(set(urls)) == 2 and all(u.startswith("http://127.0.0.1:") for u in urls)
        t = twin_of(urls[0] + "/")
        assert t.model == "m-1" and t.ready and t is not twin_of(urls[1])
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        r = httpx.post(f"{urls[0]}/v1/chat/completions", json=body, timeout=10)
        assert r.json()["usage"]["completion_tokens"] == 3 and t.max_live == 1 and twin_of(urls[1]).max_live == 0
    for url in urls:
        with pytest.raises(KeyError):
            twin_of(url)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=1)


def test_wait_false_yields_before_the_twin_is_healthy() -> None:
    with run_twin("tiny", wait=False, startup_delay_s=0.2) as url:
        assert httpx.get(f"{url}/health").status_code == 503


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # uvicorn's exit in its thread
def test_a_port_that_cannot_be_bound_is_an_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"could not bind port {port}"), run_twin("tiny", port=port):
            pass

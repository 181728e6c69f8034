"""``backends/failures.py``: whose fault an upstream failure is. Only evidence from the backend counts
against it (and how: an instant trip for a refused connection, a timeout by streak or rate); what the
gateway does to itself (a full pool, a lagging loop) never does."""

from __future__ import annotations

import socket

import httpx
import pytest

from backends.failures import CONNECT, MALFORMED, STATUS_5XX, STREAM_BROKEN, TIMEOUT, backend_fault, stream_fault


@pytest.mark.parametrize(
    ("status", "kind"),
    [(0, None), (200, None), (404, None), (429, None), (499, None), (500, STATUS_5XX), (503, STATUS_5XX)],
)
def test_an_answered_status_counts_only_when_it_is_a_5xx(status: int, kind: str | None) -> None:
    assert backend_fault(status=status) == kind


@pytest.mark.parametrize(
    ("exc", "kind", "lagging_kind"),
    [
        (httpx.PoolTimeout("pool"), None, None),  # our own connection budget
        (httpx.ConnectTimeout("slow accept"), TIMEOUT, None),  # ambiguous: a timeout, never an instant trip
        (httpx.ReadTimeout("read"), TIMEOUT, None),
        (httpx.WriteTimeout("write"), TIMEOUT, None),
        (httpx.ConnectError("refused"), CONNECT, CONNECT),  # the backend is not there, lagging or not
        (httpx.ReadError("reset"), STREAM_BROKEN, STREAM_BROKEN),
        (httpx.RemoteProtocolError("closed mid-answer"), STREAM_BROKEN, STREAM_BROKEN),
        (ConnectionResetError(), STREAM_BROKEN, STREAM_BROKEN),
        (ValueError("our bug"), None, None),
        (httpx.InvalidURL("bad"), None, None),
    ],
)
def test_exceptions_by_whose_fault_they_are(exc: BaseException, kind: str | None, lagging_kind: str | None) -> None:
    assert backend_fault(exc) == kind
    assert backend_fault(exc, lagging=True) == lagging_kind


def test_an_exception_wins_over_a_status() -> None:
    assert backend_fault(httpx.PoolTimeout("p"), status=503) is None


def test_a_refused_connection_on_loopback_is_a_connect_fault() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: the kernel refuses
        with pytest.raises(httpx.HTTPError) as info:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0)
    assert backend_fault(info.value) == CONNECT


def test_a_backend_that_accepts_and_never_answers_is_a_timeout() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with pytest.raises(httpx.HTTPError) as info:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.1)
    assert isinstance(info.value, httpx.ReadTimeout)
    assert backend_fault(info.value) == TIMEOUT and backend_fault(info.value, lagging=True) is None


@pytest.mark.parametrize(
    ("error", "kind", "lagging_kind"),
    [
        (None, None, None),
        ("", None, None),
        (STREAM_BROKEN, STREAM_BROKEN, STREAM_BROKEN),
        (MALFORMED, STREAM_BROKEN, STREAM_BROKEN),  # bytes that are not HTTP: a broken stream
        (TIMEOUT, TIMEOUT, None),
        ("client_gone", None, None),
    ],
)
def test_a_relay_that_ended_with_an_error(error: str | None, kind: str | None, lagging_kind: str | None) -> None:
    assert stream_fault(error) == kind
    assert stream_fault(error, lagging=True) == lagging_kind

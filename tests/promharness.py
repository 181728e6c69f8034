"""Run a real Prometheus server for tests.

    from tests.promharness import prometheus

    with prometheus({"cachegate": ["127.0.0.1:8080"], "sglang": sim_targets}) as prom:
        prom.wait_for("sum(cachegate_requests_total) >= 10")
        rows = prom.query('sum by (status) (cachegate_requests_total)')
        ex = prom.query_exemplars("cachegate_ttft_seconds_bucket", start, end)

The binary is Debian's ``prometheus`` package (``.ci/run`` installs it when missing). Each server gets a
free loopback port, a temporary config (the given scrape targets, scraped every second, OpenMetrics
negotiated so exemplars come through) and a temporary storage directory, runs with
``--enable-feature=exemplar-storage``, and is stopped and its directory removed when the block ends.
Ready (``/-/ready``) takes well under a second, but Prometheus 2.x applies discovered targets on a fixed
5 s tick, so the first scrape lands about 5-6 s after start: use ``wait_for`` rather than sleeping.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

Targets = Mapping[str, Sequence[str]] | Sequence[str]


class PrometheusError(RuntimeError):
    """Prometheus did not start, or a query failed."""


def find_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        raise PrometheusError("no `prometheus` binary on PATH: apt-get install -y prometheus (.ci/run does)")
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape_config(targets: Targets, interval: str = "1s") -> dict[str, Any]:
    """The prometheus.yml content: one job per key (a bare list is the job ``targets``)."""
    jobs = dict(targets) if isinstance(targets, Mapping) else {"targets": list(targets)}
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {"job_name": job, "metrics_path": "/metrics", "static_configs": [{"targets": list(hosts)}]}
            for job, hosts in jobs.items()
        ],
    }


class Prometheus:
    """A running Prometheus server and a small client for its HTTP API."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.proc = proc
        self.log = log
        self._http = httpx.Client(base_url=url, timeout=10.0)

    def close(self) -> None:
        self._http.close()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _get(self, path: str, params: dict[str, str]) -> Any:
        r = self._http.get(path, params=params)
        try:
            body = r.json()
        except ValueError as e:
            raise PrometheusError(f"{path}: HTTP {r.status_code}: {r.text[:300]}") from e
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query; the vector's samples as ``{"metric": {...}, "value": [ts, "v"]}``.

        A scalar result comes back as one sample with empty labels.
        """
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        if data["resultType"] == "vector":
            return list(data["result"])
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        raise PrometheusError(f"{expr}: unexpected result type {data['resultType']}")

    def values(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Instant query as ``{sorted label items: float value}``."""
        return {tuple(sorted(s["metric"].items())): float(s["value"][1]) for s in self.query(expr)}

    def query_exemplars(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        """``/api/v1/query_exemplars``: ``[{"seriesLabels": {...}, "exemplars": [{"labels", "value",
        "timestamp"}]}]``."""
        return list(self._get("/api/v1/query_exemplars", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}"}))

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing) with their labels."""
        return list(self._get("/api/v1/alerts", {})["alerts"])

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets with their ``health`` and ``lastError``."""
        return list(self._get("/api/v1/targets", {"state": "active"})["activeTargets"])

    def wait_for(
        self,
        expr: str,
        timeout: float = 20.0,
        interval: float = 0.25,
        predicate: Callable[[list[dict[str, Any]]], bool] = bool,
    ) -> list[dict[str, Any]]:
        """Poll ``expr`` until ``predicate(result)`` holds (default: a non-empty result); return it."""
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() >= deadline:
                health = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in self.targets()]
                raise TimeoutError(f"{expr!r} still {result!r} after {timeout}s; targets: {health}")
            if self.proc.poll() is not None:
                raise PrometheusError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
            time.sleep(interval)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> bool:
    """True once ``/-/ready`` answers 200; False if the process died (e.g. its port was taken)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            if httpx.get(f"{url}/-/ready", timeout=1.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise PrometheusError(
        f"prometheus at {url} not ready after {timeout}s:\n"
        + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def prometheus(
    targets: Targets,
    *,
    scrape_interval: str = "1s",
    ready_timeout: float = 20.0,
    extra_args: Sequence[str] = (),
    rules: str | None = None,
) -> Iterator[Prometheus]:
    """Start Prometheus scraping ``targets`` (``{job: ["host:port", ...]}`` or a list), evaluating the
    rule file content ``rules`` if given (every ``scrape_interval``); stop it at exit."""
    binary = find_binary()
    workdir = Path(tempfile.mkdtemp(prefix="promharness-"))
    config = workdir / "prometheus.yml"
    content = scrape_config(targets, scrape_interval)
    if rules is not None:
        (workdir / "rules.yml").write_text(rules)
        content["rule_files"] = [str(workdir / "rules.yml")]
    config.write_text(yaml.safe_dump(content, sort_keys=False))
    log = workdir / "prometheus.log"
    proc: subprocess.Popen[bytes] | None = None
    server: Prometheus | None = None
    try:
        for _ in range(5):  # another process may take the free port between probe and bind
            port = _free_port()
            url = f"http://127.0.0.1:{port}"
            with log.open("ab") as sink:
                proc = subprocess.Popen(
                    [
                        binary,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={workdir / 'data'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--enable-feature=exemplar-storage",
                        "--storage.tsdb.retention.time=1h",
                        "--log.level=warn",
                        *extra_args,
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=sink,
                )
            if _wait_ready(url, proc, log, ready_timeout):
                break
            _stop(proc)
        else:
            raise PrometheusError(f"prometheus would not start:\n{log.read_text(errors='replace')[-2000:]}")
        server = Prometheus(url, proc, log)
        yield server
    finally:
        if server is not None:
            server.close()
        if proc is not None:
            _stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)

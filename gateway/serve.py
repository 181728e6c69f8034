"""Start the gateway under uvicorn (uvloop, httptools), one worker or several.

The HTTP protocol is uvicorn's httptools one plus the limits it lacks (gateway/http/server.py:
header and body timeouts, header size and count); keep-alive, connection cap and backlog come from
the config's ``server:`` section. The open-files limit is raised to its hard limit, so that many
idle connections cannot starve the gateway of file descriptors before the header timeout frees them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
from pathlib import Path

import uvicorn

from gateway.app import create_app
from gateway.config.logsetup import configure_logging
from gateway.config.schema import Config
from gateway.http.gcpause import ENV as QUIET_GC
from gateway.http.server import ENV as LIMITS_ENV
from gateway.observability.metrics import prepare_multiprocess_dir

log = logging.getLogger("cachegate")


def run(config: Config) -> None:
    configure_logging(config)
    workers = config.worker_count()
    if workers > 1 and not config.redis_url:
        sys.exit(
            "cachegate: --workers N > 1 needs Redis (--redis-url or CACHEGATE_REDIS_URL), so that the "
            "workers share team limits and backend reservations; run one worker, or set a Redis URL."
        )
    if not config.models:
        sys.exit("cachegate: no models configured: give --config FILE, or --backend URL --model ALIAS")
    _raise_open_files()
    _check_backlog(config.server.backlog)
    server = config.server
    os.environ[LIMITS_ENV] = server.model_dump_json()  # read by every worker's protocol
    os.environ[QUIET_GC] = "1"  # each worker freezes its start-up objects (gateway/http/gcpause.py)
    common = dict(
        host=config.listen.host,
        port=config.listen.port,
        loop="uvloop",
        http="gateway.http.server:LimitedHttpToolsProtocol",
        log_level=config.log_level.lower(),
        access_log=False,
        # Nothing reads the client's address (keys name the team): no X-Forwarded-For layer per request.
        proxy_headers=False,
        timeout_keep_alive=server.keep_alive_s,
        timeout_graceful_shutdown=10,
        limit_concurrency=server.limit_concurrency,
        backlog=server.backlog,
    )
    if workers > 1:
        log.info("starting %d workers (--workers; default one per core with Redis)", workers)
        os.environ["CACHEGATE_CONFIG_JSON"] = config.model_dump_json()
        # Before any worker exists: each spawned worker reads it on importing prometheus_client.
        prepare_multiprocess_dir()
        uvicorn.run("gateway.app:app_from_env", factory=True, workers=workers, **common)  # type: ignore[arg-type]
    else:
        uvicorn.run(create_app(config), **common)  # type: ignore[arg-type]


def _check_backlog(backlog: int) -> None:
    """The kernel silently caps the accept backlog at ``net.core.somaxconn``: say so once at start."""
    with contextlib.suppress(OSError, ValueError):
        cap = int(Path("/proc/sys/net/core/somaxconn").read_text())
        if cap < backlog:
            log.info("accept backlog %d is capped at net.core.somaxconn = %d by the kernel", backlog, cap)


def _raise_open_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit from %d: %s", soft, exc)

"""Start the gateway under uvicorn (uvloop, httptools), one worker or several."""

from __future__ import annotations

import logging
import os
import sys

import uvicorn

from gateway.app import create_app
from gateway.config import Config
from gateway.metrics import prepare_multiprocess_dir

log = logging.getLogger("cachegate")


def run(config: Config) -> None:
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream request is noise
    workers = config.worker_count()
    if workers > 1 and not config.redis_url:
        sys.exit("cachegate: --workers N > 1 needs Redis (--redis-url or CACHEGATE_REDIS_URL), so that the "
                 "workers share team limits and backend reservations; run one worker, or set a Redis URL.")
    if not config.models:
        sys.exit("cachegate: no models configured: give --config FILE, or --backend URL --model ALIAS")
    common = dict(host=config.listen.host, port=config.listen.port, loop="uvloop", http="httptools",
                  log_level=config.log_level.lower(), access_log=False, timeout_keep_alive=75,
                  timeout_graceful_shutdown=10)
    if workers > 1:
        log.info("starting %d workers (--workers; default one per core with Redis)", workers)
        os.environ["CACHEGATE_CONFIG_JSON"] = config.model_dump_json()
        # Before any worker exists: each spawned worker reads it on importing prometheus_client.
        prepare_multiprocess_dir()
        uvicorn.run("gateway.app:app_from_env", factory=True, workers=workers, **common)  # type: ignore[arg-type]
    else:
        uvicorn.run(create_app(config), **common)  # type: ignore[arg-type]

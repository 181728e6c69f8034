"""The process's log lines: layout and level, the same in ``cachegate serve`` and in each worker it
spawns (whose root logger would otherwise print bare messages, without time, level or logger name,
and drop INFO). The access log is written apart from these (``gateway/observability/access.py``)."""

from __future__ import annotations

import logging

from gateway.config.schema import Config

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(config: Config) -> None:
    logging.basicConfig(level=config.log_level.upper(), format=FORMAT)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream request is noise

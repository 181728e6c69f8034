"""Run a twin app under uvicorn (used by ``cachegate sim-backend`` and by the test helper)."""

from __future__ import annotations

import importlib.util
from typing import Any

import uvicorn

from backends.sim.server import create_app


def uvicorn_config(
    app: Any, host: str, port: int, log_level: str = "warning", tls: tuple[str, str] | None = None
) -> uvicorn.Config:
    """``tls``: (certificate chain, key) PEM files: serve HTTPS (an endpoint behind TLS)."""
    # uvloop/httptools when installed (as SGLang runs), asyncio/h11 otherwise.
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        loop=loop,
        http=http,
        timeout_keep_alive=5,
        access_log=False,
        lifespan="on",
        ssl_certfile=tls[0] if tls else None,
        ssl_keyfile=tls[1] if tls else None,
    )


def serve(
    profile: str = "tiny", *, host: str = "127.0.0.1", port: int = 30000, log_level: str = "warning", **app_kwargs: Any
) -> None:
    """Serve one twin until interrupted. ``app_kwargs`` go to :func:`create_app`."""
    app = create_app(profile, host=host, **app_kwargs)
    uvicorn.Server(uvicorn_config(app, host, port, log_level)).run()

"""The running service. This package's own modules compose its parts: ``app`` (the Starlette routes,
start-up and shut-down), ``worker`` (what one worker holds and how it is wired), ``serve`` (uvicorn, one
worker or several), ``admin`` (the admin API) and ``cli`` (the ``cachegate`` command, the one module
that may import every package, ``loadtest`` and ``backends.sim`` included, and only lazily). The
subpackages below them, from the bottom: ``config``, ``http``, ``observability``, ``state``, ``relay``,
``surfaces``, ``request``; each may import only those the table in ``docs/architecture.md`` allows
(``tests/gateway/test_layers.py`` holds it)."""

"""The floor of a short request on cachegate's stack: uvicorn (uvloop, httptools) and the lean
upstream client (``gateway/http/wire.py``), with none of the gateway between them.

    python -m loadtest.bench.floor_proxy --upstream URL --port P

A POST is read whole, sent to ``URL`` + its path on a pooled keep-alive connection, and the whole
answer (status, content type, body) goes back to the client. No authentication, parsing, admission,
routing, metrics, traces or access log: what is left is the server, the event loop, the sockets and
the client, which every request through cachegate also pays. ``cachegate bench --floor`` runs it
beside the gateway and the routers in the short-request mode, so the gateway's own share of a
request (its cost over the floor's) and the stack's (the floor's against the router's) are measured
in the same run. Not for streams: an answer is relayed once complete.
"""

from __future__ import annotations

import argparse

import uvicorn
from starlette.types import Receive, Scope, Send

from gateway.http.wire_pool import WireClient
from gateway.relay.proxy import read_body


class FloorProxy:
    """The ASGI app: each POST relayed whole to ``upstream`` (see the module docstring)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.client: WireClient | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            if self.client is not None:
                await self.client.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":  # readiness
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        if self.client is None:  # made on the serving loop
            self.client = WireClient(connect_timeout_s=3, idle_s=300, keepalive_expiry_s=3, max_connections=1000)
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        response = await self.client.send(
            "POST", self.upstream + scope["path"], {"content-type": "application/json"}, b"".join(parts)
        )
        try:
            body = await read_body(response)
        finally:
            await response.aclose()
        ctype = response.headers.get("content-type", "application/json").encode()
        headers = [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(
        FloorProxy(args.upstream),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()

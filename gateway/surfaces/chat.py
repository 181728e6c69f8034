"""``POST /v1/chat/completions`` and ``POST /v1/completions``: OpenAI surfaces relayed byte for byte.

Parsing and the upstream rewrite are ``gateway/surfaces/openai.py``'s; this module plugs them into the
request path (``gateway/surfaces/base.py``).
"""

from __future__ import annotations

from gateway.surfaces.base import ClientRequest, PassthroughRelay, Surface, Target, UpstreamCall
from gateway.surfaces.openai import Kind, ParsedRequest, parse, upstream_body

PATHS: dict[Kind, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


class OpenAISurface(Surface):
    """The same API upstream as downstream: the alias becomes the served name, the DP rank is pinned
    with ``routed_dp_rank``, and a stream asks for usage (dropped again if the client did not)."""

    def __init__(self, kind: Kind) -> None:
        self.kind: Kind = kind
        self.name = kind
        self.path = PATHS[kind]

    def parse(self, raw: bytes) -> ClientRequest:
        parsed = parse(raw, self.kind)
        return ClientRequest(
            model=parsed.model,
            stream=parsed.stream,
            max_tokens=parsed.max_tokens,
            prompt=parsed.body,
            body=parsed.body,
            native=parsed,
        )

    def upstream(self, req: ClientRequest, target: Target) -> UpstreamCall:
        parsed = req.native
        assert isinstance(parsed, ParsedRequest)
        body, injected = upstream_body(parsed, target.upstream_model, rank=target.rank)
        return UpstreamCall(self.path, body, PassthroughRelay(strip_usage=injected))


CHAT = OpenAISurface("chat")
COMPLETIONS = OpenAISurface("completion")

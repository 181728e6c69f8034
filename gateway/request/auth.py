"""API keys → teams. Keys are held only as SHA-256 digests and compared in constant time.

A key may come in ``Authorization: Bearer <key>``, ``x-api-key`` (Anthropic) or ``api-key`` (Azure
OpenAI). Every non-empty one is tried, so an empty or malformed header never hides a valid key in
another; the first that matches gives the team.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.datastructures import Headers

from gateway.config.schema import Config
from gateway.http.errors import GatewayError


class KeyStore:
    def __init__(self, config: Config) -> None:
        self._digests: list[tuple[bytes, str]] = [(bytes.fromhex(k.sha256), k.team) for k in config.keys]

    @property
    def open(self) -> bool:
        """No keys configured: every request is accepted as team ``default``."""
        return not self._digests

    def team_for(self, headers: Headers) -> str:
        """The team of the request's key; raises 401 when keys are configured and it is missing or wrong."""
        if self.open:
            return "default"
        keys = presented_keys(headers)
        if not keys:
            raise GatewayError(
                401, "Missing API key: send 'Authorization: Bearer <key>', 'x-api-key' or 'api-key'.", "missing_api_key"
            )
        team = None
        for key in keys:
            digest = hashlib.sha256(_sent_bytes(key)).digest()
            # Compare against every digest so timing says nothing about which (if any) matched.
            for known, known_team in self._digests:
                if hmac.compare_digest(digest, known) and team is None:
                    team = known_team
        if team is None:
            raise GatewayError(401, "Invalid API key.", "invalid_api_key")
        return team

    def allowed(self, headers: Headers, admin_token: str | None) -> bool:
        """A valid team key or the admin token (for endpoints the config closes to anonymous callers)."""
        if any(check_token(key, admin_token) for key in presented_keys(headers)):
            return True
        if self.open:
            return False  # no team keys exist: only the admin token opens a closed endpoint
        try:
            self.team_for(headers)
        except GatewayError:
            return False
        return True


def presented_keys(headers: Headers) -> list[str]:
    """Every non-empty key the request presents, in order: Authorization (Bearer, or a bare key),
    x-api-key, api-key; at most 8 (repeated headers count once each)."""
    keys: list[str] = []
    for auth in headers.getlist("authorization"):
        scheme, _, value = auth.strip().partition(" ")
        key = value.strip() if scheme.lower() == "bearer" else auth.strip()
        if key and scheme.lower() != "basic":
            keys.append(key)
    for name in ("x-api-key", "api-key"):
        keys += [v.strip() for v in headers.getlist(name) if v.strip()]
    return keys[:8]


def check_token(presented: str | None, expected: str | None) -> bool:
    """Constant-time check of an admin token (False when the admin API is off)."""
    if not expected or not presented:
        return False
    return hmac.compare_digest(
        hashlib.sha256(_sent_bytes(presented)).digest(), hashlib.sha256(expected.encode()).digest()
    )


def _sent_bytes(key: str) -> bytes:
    """The bytes the client sent: ASGI servers decode header values as latin-1, so encoding back gives
    them (a key configured as ``clé`` and sent in UTF-8 matches its UTF-8 digest); a str that never
    came off the wire (no latin-1 form) is taken as UTF-8."""
    try:
        return key.encode("latin-1")
    except UnicodeEncodeError:
        return key.encode("utf-8", "surrogateescape")

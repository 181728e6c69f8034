"""API keys → teams. Keys are held only as SHA-256 digests and compared in constant time."""

from __future__ import annotations

import hashlib
import hmac

from starlette.datastructures import Headers

from gateway.config import Config
from gateway.errors import GatewayError


class KeyStore:
    def __init__(self, config: Config) -> None:
        self._digests: list[tuple[bytes, str]] = [(bytes.fromhex(k.sha256), k.team) for k in config.keys]

    @property
    def open(self) -> bool:
        """No keys configured: every request is accepted as team ``default``."""
        return not self._digests

    def team_for(self, headers: Headers) -> str:
        """The team of the request's key; raises 401 when keys are configured and it is missing or wrong."""
        key = _presented_key(headers)
        if self.open:
            return "default"
        if key is None:
            raise GatewayError(401, "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key'.",
                               "missing_api_key")
        digest = hashlib.sha256(key.encode()).digest()
        team = None
        # Compare against every digest so timing says nothing about which (if any) matched.
        for known, known_team in self._digests:
            if hmac.compare_digest(digest, known) and team is None:
                team = known_team
        if team is None:
            raise GatewayError(401, "Invalid API key.", "invalid_api_key")
        return team


def _presented_key(headers: Headers) -> str | None:
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None if scheme.lower() == "bearer" else auth.strip() or None
    key = headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


def check_token(presented: str | None, expected: str | None) -> bool:
    """Constant-time check of an admin token (False when the admin API is off)."""
    if not expected or not presented:
        return False
    return hmac.compare_digest(hashlib.sha256(presented.encode()).digest(),
                               hashlib.sha256(expected.encode()).digest())

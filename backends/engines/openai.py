"""An endpoint that publishes no engine signals (a hosted OpenAI-compatible endpoint): in rotation
while ``/v1/models`` answers 200, no capacity, no load, no DP ranks. Admission there works from what
the gateway observes, or from a configured ``kv_tokens``."""

from __future__ import annotations

from typing import ClassVar

from backends.engines.base import EngineAdapter, Fetch, Info


class OpenAICompatible(EngineAdapter):
    name: ClassVar[str] = "openai"
    health_path: ClassVar[str] = "/v1/models"
    """Hosted endpoints rarely serve ``/health``; every OpenAI-compatible one serves the model list."""

    async def read_info(self, get: Fetch) -> tuple[Info, str | None]:
        return Info(), None  # nothing to read: "fetched" at once, so it is never asked again

    def pin(self, rank: int | None) -> tuple[int | None, dict[str, str]]:
        return None, {}

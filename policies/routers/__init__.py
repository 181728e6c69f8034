"""Routing policies (one small class each; ``policies.registry.ROUTERS`` names them)."""

from policies.routers.estimators import CommonBlocks, PrefillModel
from policies.routers.least_load import LeastLoad
from policies.routers.min_ttft import MinTTFT
from policies.routers.sglang_cache_aware import SglangCacheAware

__all__ = ["CommonBlocks", "LeastLoad", "MinTTFT", "PrefillModel", "SglangCacheAware"]

"""Engine adapters: one module per engine dialect behind ``base.EngineAdapter`` (``docs/engines.md``)."""

from __future__ import annotations

from backends.engines.base import EngineAdapter, Fetch, Info, Load
from backends.engines.detect import Undetected, detect
from backends.engines.openai import OpenAICompatible
from backends.engines.sglang import SGLang
from backends.engines.vllm import VLLM

__all__ = ["ENGINES", "EngineAdapter", "Fetch", "Info", "Load", "detect", "make"]

ENGINES: dict[str, type[EngineAdapter]] = {
    "sglang": SGLang,
    "vllm": VLLM,
    "openai": OpenAICompatible,
    "auto": Undetected,
}
"""The values of a backend's ``engine:`` (``auto`` resolves to one of the others)."""


def make(engine: str) -> EngineAdapter:
    """A fresh adapter for one backend."""
    return ENGINES[engine]()

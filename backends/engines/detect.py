"""``engine: auto``: which engine a server is, from what it answers.

SGLang answers ``/get_server_info`` (200, a JSON object); vLLM's ``/metrics`` carries
``vllm:cache_config_info``. A server that answers neither stays undetected and is asked again at
each health check; until then it is handled as SGLang is (``/health``, ``/v1/loads``, the DP rank in
the body: what the pool did before it knew other engines), so nothing changes for an SGLang server
that is slow to answer its info route.
"""

from __future__ import annotations

from typing import ClassVar

from backends.engines.base import EngineAdapter, Fetch, Info
from backends.engines.sglang import SGLang
from backends.engines.vllm import VLLM


class Undetected(SGLang):
    """``auto`` before the server has said what it is."""

    name: ClassVar[str] = "auto"
    native_surfaces: ClassVar[frozenset[str]] = frozenset()


async def detect(get: Fetch) -> tuple[EngineAdapter | None, Info, str | None]:
    """``(adapter, its info, None)`` for a recognised server, else ``(None, partial info, why not)``."""
    sglang = SGLang()
    info, error = await sglang.read_info(get)
    if error is None:
        return sglang, info, None
    vllm = VLLM()
    vinfo, verror = await vllm.read_info(get)
    if verror is None:
        vinfo.max_model_len = vinfo.max_model_len or info.max_model_len
        return vllm, vinfo, None
    return None, info, f"{error}; /metrics: {verror}"

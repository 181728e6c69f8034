"""SGLang 0.5.23: ``/get_server_info`` and ``/get_model_info`` once, ``/v1/loads`` every poll, a DP rank
pinned by the body field ``routed_dp_rank`` (``/work/shared/reference``; the twin's fidelity tests check
the routes and fields against SGLang's own source)."""

from __future__ import annotations

from typing import Any, ClassVar

from backends.engines.base import READ_ERRORS, EngineAdapter, Fetch, Info, Load


def parse_server_info(info: dict[str, Any]) -> Info:
    """``/get_server_info``: the token pool and running cap per DP rank, DP size, context window."""
    dp = info.get("dp_size")
    return Info(
        kv_tokens=int(info.get("max_total_num_tokens") or 0),
        dp_ranks=int(dp) if dp else None,
        max_running_requests=int(info.get("max_running_requests") or 0),  # per DP rank: a seat budget
        max_model_len=int(info.get("max_model_len") or info.get("context_length") or 0),
    )


def parse_loads(data: dict[str, Any]) -> Load | None:
    """``/v1/loads``: running and waiting summed over ranks, the fullest rank's token usage, the mean
    hit rate, the pool size of the first rank (None: no ranks listed)."""
    loads = data.get("loads") or []
    if not loads:
        return None
    return Load(
        running=sum(int(r.get("num_running_reqs") or 0) for r in loads),
        waiting=sum(int(r.get("num_waiting_reqs") or 0) for r in loads),
        token_usage=max(float(r.get("token_usage") or 0.0) for r in loads),
        cache_hit_rate=sum(float(r.get("cache_hit_rate") or 0.0) for r in loads) / len(loads),
        kv_tokens=int(loads[0].get("max_total_num_tokens") or 0),
        ranks=len(loads),
    )


class SGLang(EngineAdapter):
    name: ClassVar[str] = "sglang"
    native_surfaces: ClassVar[frozenset[str]] = frozenset({"responses", "messages"})
    info_route: ClassVar[str] = "/get_server_info"

    async def read_info(self, get: Fetch) -> tuple[Info, str | None]:
        error: str | None = None
        try:
            response = await get("/get_server_info")
            if response.status_code != 200:
                raise ValueError(f"/get_server_info answered {response.status_code}")
            info = parse_server_info(response.json())
        except READ_ERRORS as exc:
            info, error = Info(), str(exc) or type(exc).__name__
        try:  # the context window as the model info states it wins over the server's
            response = await get("/get_model_info")
            if response.status_code == 200:
                info.max_model_len = int(response.json().get("max_model_len") or 0) or info.max_model_len
        except READ_ERRORS:
            pass
        return info, error

    async def read_load(self, get: Fetch) -> Load | None:
        response = await get("/v1/loads")
        if response.status_code != 200:
            raise ValueError(f"/v1/loads answered {response.status_code}")
        return parse_loads(response.json())

    def pin(self, rank: int | None) -> tuple[int | None, dict[str, str]]:
        return rank, {}

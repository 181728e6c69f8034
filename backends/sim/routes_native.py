"""SGLang's native routes: health, server and model info, ``/v1/loads``, ``/metrics``, cache flush,
abort, ``/generate``; and the twin-only debug route ``GET /_twin/last_traceparent[?rid=R]``, which
returns the last ``traceparent``/``tracestate`` headers seen (overall, or for request id ``R``), so
gateway tests can check trace propagation."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from backends.sim import responses as R
from backends.sim.engine import EngineEvent, RankLoad
from backends.sim.httpio import finish_of, json_response, twin_of_request, validation_error
from backends.sim.planner import plan_request
from backends.sim.runtime import MAX_MODEL_LEN, SGLANG_VERSION, ApiError, Live, Plan, Twin, tp_size


async def health(request: Request) -> Response:
    return Response(status_code=200 if twin_of_request(request).ready else 503)


async def model_info(request: Request) -> Response:
    t = twin_of_request(request)
    return json_response(
        {
            "model_path": t.model,
            "served_model_name": t.model,
            "tokenizer_path": t.model,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "auto",
            "reasoning_parser": "kimi_k2",
            "tool_call_parser": "kimi_k2",
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "kimi_k2",
            "architectures": ["DeepseekV3ForCausalLM"],
            "max_model_len": MAX_MODEL_LEN,  # not in SGLang's reply: the twin says what context it serves
        }
    )


async def server_info(request: Request) -> Response:
    t = twin_of_request(request)
    p, e = t.profile, t.engine
    loads = t.loads()
    kv_gb = float(getattr(p, "kv_gb_per_gpu", 0.0))
    weight_gb = float(getattr(p, "weight_bytes_per_gpu", 0.0)) / 1e9
    states = [
        {
            "dp_rank": ld.dp_rank,
            "last_gen_throughput": ld.gen_throughput,
            "load": ld.num_running_reqs + ld.num_waiting_reqs,
            "memory_usage": {
                "weight": weight_gb,
                "kvcache": kv_gb,
                "token_capacity": ld.max_total_num_tokens,
                "graph": 0.0,
            },
            "num_running_reqs": ld.num_running_reqs,
            "num_waiting_reqs": ld.num_waiting_reqs,
            "token_usage": ld.token_usage,
            "cache_hit_rate": ld.cache_hit_rate,
        }
        for ld in loads
    ]
    tp = tp_size(p)
    info = {
        "model_path": t.model,
        "served_model_name": t.model,
        "tokenizer_path": t.model,
        "tp_size": tp,
        "dp_size": e.dp_size,
        "pp_size": int(getattr(p, "pp", 1)),
        "dcp_size": int(getattr(p, "dcp_size", 1)),  # decode context parallelism: KV interleaved over TP ranks
        "ep_size": 1,
        "enable_dp_attention": e.dp_size > 1,
        "load_balance_method": "round_robin",
        "page_size": p.page_size,
        "chunked_prefill_size": p.chunked_prefill_size,
        "max_prefill_tokens": p.max_prefill_tokens,
        "max_running_requests": p.max_running_requests,  # per DP rank, as the scheduler reports it
        "schedule_policy": "fcfs",
        "schedule_conservativeness": getattr(p, "schedule_conservativeness", 1.0),  # × 0.3 under DP attention
        "context_length": MAX_MODEL_LEN,
        "max_model_len": MAX_MODEL_LEN,
        "mem_fraction_static": float(getattr(p, "mem_fraction_static", 0.9)),
        "kv_cache_dtype": str(getattr(p, "kv_cache_dtype", "auto")),
        "enable_hierarchical_cache": bool(getattr(p, "host_tier_tokens", 0)),
        "enable_cache_report": t.cache_report,
        "enable_metrics": True,
        "enable_trace": False,
        "reasoning_parser": "kimi_k2",
        "tool_call_parser": "kimi_k2",
        "max_total_num_tokens": e.max_total_num_tokens,
        "max_req_input_len": min(MAX_MODEL_LEN, e.max_total_num_tokens) - 1,
        "startup_time": t.startup_time,
        "internal_states": states,
        "version": SGLANG_VERSION,
        "frontend": "python",
        "twin": {"profile": getattr(p, "name", "?"), "time_scale": t.time_scale},
    }
    return json_response(info)


_LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


def _load_dict(t: Twin, ld: RankLoad, include: set[str] | None) -> dict[str, Any]:
    x = ld.extra
    used = ld.num_used_tokens
    pending = int(x.get("num_pending_tokens", 0))
    d: dict[str, Any] = {
        "timestamp": time.time(),
        "dp_rank": ld.dp_rank,
        "num_running_reqs": ld.num_running_reqs,
        "num_waiting_reqs": ld.num_waiting_reqs,
        "num_waiting_uncached_tokens": int(x.get("num_waiting_uncached_tokens", 0)),
        "num_used_tokens": used,
        "num_total_tokens": used + pending,
        "num_active_tokens": used + pending,
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": ld.max_total_num_tokens,
        "max_running_requests": ld.max_running_requests,
        "token_usage": ld.token_usage,
        "gen_throughput": ld.gen_throughput,
        "cache_hit_rate": ld.cache_hit_rate,
        "utilization": float(x.get("utilization", ld.token_usage)),
        "total_prefill_uncached_tokens": int(x.get("total_prefill_uncached_tokens", 0)),
        "total_prefill_busy_us": int(x.get("total_prefill_busy_us", 0)),
        "decode_moments": None,
    }
    if include == {"core"}:
        return d
    if include is None or "all" in include or "memory" in include:
        d["memory"] = {
            "weight_gb": float(getattr(t.profile, "weight_bytes_per_gpu", 0.0)) / 1e9,
            "kv_cache_gb": float(getattr(t.profile, "kv_gb_per_gpu", 0.0)),
            "graph_gb": 0.0,
            "token_capacity": ld.max_total_num_tokens,
        }
    if include is None or "all" in include or "queues" in include:
        d["queues"] = {
            "waiting": ld.num_waiting_reqs,
            "grammar": 0,
            "paused": 0,
            "retracted": int(x.get("num_retracted_reqs", 0)),
            "prealloc_ready": 0,
        }
    return d


async def v1_loads(request: Request) -> Response:
    t = twin_of_request(request)
    q = request.query_params
    include = {s.strip() for s in q["include"].split(",")} if q.get("include") else None
    if include is not None and not include <= _LOAD_SECTIONS:
        msg = f"Invalid include sections: {include - _LOAD_SECTIONS}. Valid options: {sorted(_LOAD_SECTIONS)}"
        return json_response(R.error_body(msg, "400", 400), 400)
    loads = t.loads()
    if q.get("dp_rank") is not None:
        try:
            rank = int(q["dp_rank"])
        except ValueError:
            return validation_error(f"Input should be a valid integer: dp_rank={q['dp_rank']!r}")
        loads = [ld for ld in loads if ld.dp_rank == rank]
        if not loads:
            return json_response(R.error_body(f"dp_rank {rank} out of range [0, {t.engine.dp_size})", "400", 400), 400)
    dicts = [_load_dict(t, ld, include) for ld in loads]
    if q.get("format") == "prometheus":
        samples: dict[str, list[tuple[int, float]]] = {}
        prefixes = {"speculative": "spec", "disaggregation": "disagg"}
        for d in dicts:
            d = dict(d)
            rank = d.pop("dp_rank")
            for k, v in d.items():
                if isinstance(v, dict):
                    for sk, sv in v.items():
                        if isinstance(sv, int | float):
                            samples.setdefault(f"sglang_{prefixes.get(k, k)}_{sk}", []).append((rank, sv))
                elif isinstance(v, int | float):
                    samples.setdefault(f"sglang_{k}", []).append((rank, v))
        lines: list[str] = []
        for name, vals in samples.items():
            lines.append(f"# TYPE {name} gauge")
            lines.extend(f'{name}{{dp_rank="{r}"}} {v}' for r, v in vals)
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4; charset=utf-8")
    return json_response(
        {
            "timestamp": datetime.now(UTC).isoformat(),
            "version": SGLANG_VERSION,
            "accelerator": getattr(t.profile, "accelerator", None),
            "num_accelerators": max(1, tp_size(t.profile) * int(getattr(t.profile, "pp", 1)) // t.engine.dp_size),
            "loads": dicts,
        }
    )


async def metrics(request: Request) -> Response:
    t = twin_of_request(request)
    # SGLang serves its metrics in prometheus-client's multiprocess mode, which has no *_created series.
    lines = generate_latest(t.metrics.registry).decode().splitlines(keepends=True)
    body = "".join(ln for ln in lines if not _CREATED.match(ln))
    return Response(body, media_type=CONTENT_TYPE_LATEST)


_CREATED = re.compile(r"^(# (HELP|TYPE) )?\S+_created[ {]")


async def flush_cache(request: Request) -> Response:
    t = twin_of_request(request)
    t._catch_up()
    if t.engine.flush_cache():
        t._dispatch([])  # publish AllBlocksCleared now
        return Response(
            "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
            "waiting requests, the operation will not be performed.)\n",
            status_code=200,
        )
    return Response("Flush cache failed.\n", status_code=400)


async def abort_request(request: Request) -> Response:
    t = twin_of_request(request)
    try:
        body = orjson.loads(await request.body() or b"{}")
    except orjson.JSONDecodeError:
        return validation_error("JSON decode error")
    if not isinstance(body, dict):
        return validation_error("Input should be a valid dictionary")
    if body.get("abort_all"):
        for rid in list(t.live):
            t.abort(rid)
    elif body.get("rid"):
        t.abort(str(body["rid"]))
    return Response(status_code=200)


async def last_traceparent(request: Request) -> Response:
    t = twin_of_request(request)
    rid = request.query_params.get("rid")
    if rid is not None:
        entry = t.traceparents.get(rid)
        return json_response(entry or {"rid": rid, "traceparent": None, "tracestate": None})
    return json_response(t.last_trace)


def _meta(t: Twin, live: Live, rid: str, n: int, ev: EngineEvent | None, plan: Plan) -> dict[str, Any]:
    fr: dict[str, Any] | None = None
    if ev is not None:
        finish, matched = finish_of(plan, ev)
        if finish == "abort":
            fr = {"type": "abort", "message": ev.message or "Abort"}
        elif finish == "length":
            fr = {"type": "length", "length": n}
        else:
            fr = {"type": "stop", "matched": matched}
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": fr,
        "prompt_tokens": live.prompt_tokens,
        "weight_version": "default",
        "total_retractions": ev.retractions if ev else 0,
        "completion_tokens": n,
        "cached_tokens": live.cached_tokens,
    }
    if ev is not None:
        meta["e2e_latency"] = max(0.0, ev.time - live.arrival)
    return meta


async def generate(request: Request) -> Response:
    t = twin_of_request(request)
    try:
        body = orjson.loads(await request.body())
        if not isinstance(body, dict):
            raise ApiError("Input should be a valid dictionary")
        text = body.get("text")
        if text is None and isinstance(body.get("input_ids"), list):
            # Token ids: each id stands for 4 bytes so counts stay exact.
            text = "".join(f"{int(i) % 10000:04d}" for i in body["input_ids"])
        if not isinstance(text, str):
            raise ApiError("Either text or input_ids should be provided.")
        sp = body.get("sampling_params") or {}
        plan = plan_request(
            t,
            text,
            body,
            max_tokens=sp.get("max_new_tokens"),
            seed=sp.get("seed", ""),
            ignore_eos=bool(sp.get("ignore_eos")),
        )
    except orjson.JSONDecodeError:
        return json_response({"error": {"message": "JSON decode error"}}, 400)
    except ApiError as e:
        return json_response({"error": {"message": e.message}}, 400)
    stream = bool(body.get("stream"))
    rid = str(body.get("rid") or uuid.uuid4().hex)
    t.record_trace(rid, request)
    try:
        live = t.submit(rid, plan, stream)
    except ApiError as e:
        return json_response({"error": {"message": e.message}}, 400)
    if not stream:
        ev = await t.wait_or_disconnect(live.done, live, request)
        if ev is None:
            return Response(status_code=499)
        n = ev.completion_tokens
        return json_response(
            {
                "text": live.content[: 4 * n],
                "output_ids": _ids(live.content, n),
                "meta_info": _meta(t, live, rid, n, ev, plan),
            }
        )

    async def gen() -> AsyncIterator[bytes]:
        try:
            first = await t.wait_or_disconnect(live.first, live, request)
            if first is None:
                return
            while not live.done.done():
                n = t.generated(live)
                if n > live.sent:
                    live.sent = n
                    yield R.sse(
                        {
                            "text": live.content[: 4 * n],
                            "output_ids": _ids(live.content, n),
                            "meta_info": _meta(t, live, rid, n, None, plan),
                        }
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(live.done), t.stream_interval_s)
            ev = live.done.result()
            n = ev.completion_tokens
            yield R.sse(
                {
                    "text": live.content[: 4 * n],
                    "output_ids": _ids(live.content, n),
                    "meta_info": _meta(t, live, rid, n, ev, plan),
                }
            )
            yield R.DONE
        finally:
            t.abort_later(rid, t.abort_delay_s)

    return StreamingResponse(gen(), media_type="text/event-stream")


def _ids(text: str, n: int) -> list[int]:
    """Deterministic stand-in token ids for the first ``n`` 4-byte tokens of ``text``."""
    data = text.encode()
    return [int.from_bytes(data[4 * i : 4 * i + 4].ljust(4, b" "), "little") % 163840 for i in range(n)]


async def root(request: Request) -> Response:
    """``GET``/``HEAD /``: FastAPI's JSON string (Claude Code sends ``HEAD /`` first)."""
    return json_response("SGLang is running")


async def openapi(request: Request) -> Response:
    """``/openapi.json``: the paths this twin serves (a gateway reads it to detect the surfaces)."""
    paths: dict[str, dict[str, Any]] = {}
    for route in request.app.routes:
        path = getattr(route, "path", None)
        if not path or path.startswith("/_twin") or path == "/openapi.json":
            continue
        for method in sorted(getattr(route, "methods", None) or ()):
            if method != "HEAD" or path == "/":
                paths.setdefault(path.replace(":path}", "}"), {})[method.lower()] = {"responses": {"200": {}}}
    info = {"title": "FastAPI", "version": "0.1.0"}
    return json_response({"openapi": "3.1.0", "info": info, "paths": paths})


async def seen_requests(request: Request) -> Response:
    """``GET /_twin/requests`` (twin-only): what :attr:`Twin.requests` recorded, oldest first."""
    return json_response(list(twin_of_request(request).requests))

"""The two legs of a turn on a prefill/decode-disaggregated pool (SGLang 0.5.23's PD protocol).

The decision core chose the decode backend (it admits on the decode side's KV); here the prefill
partner is chosen (``policies/prefill_choice.py``), the bootstrap fields are written into the body
(any the client sent are dropped): ``bootstrap_host`` (the prefill backend's host), ``bootstrap_port``
(its ``--disaggregation-bootstrap-port``), ``bootstrap_room`` (a random 63-bit integer); a prefill
backend with DP attention gets ``routed_dp_rank = room % dp_size`` and the decode leg the same rank
as ``disagg_prefill_dp_rank``. The same body goes to both legs at once; the decode leg's answer is
what the surface relays (byte for byte; its usage carries the prefill's ``cached_tokens``, which
SGLang hands over with the KV), the prefill leg's is read and dropped (one token, ``length``).

Neither leg may be left waiting (docs/disaggregation.md, "Failures"):
- the prefill leg fails (connect error, 5xx, broken, an error event) before the decode leg's first
  body byte: the decode leg is closed (SGLang aborts a request whose client left), the prefill
  backend blamed, and the pair tried again with another prefill backend; when every partner failed,
  ``PrefillFailed`` (the upstream hop retries elsewhere or answers 502/503);
- the prefill leg answers 4xx (a request SGLang refuses): the decode leg is closed and the prefill's
  answer is the client's (``PrefillRefused``);
- the decode leg fails or answers other than 200: the prefill leg is closed;
- the client leaves: both are closed (the caller's cancellation reaches ``PrefillLeg.end``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from urllib.parse import urlsplit

import httpx
import orjson

from backends.pool import Backend, BackendPool
from gateway.http.wire import SILENCE, WireResponse
from gateway.http.wire_pool import WireClient
from gateway.observability.metrics import Metrics
from gateway.observability.spans import UpstreamSpan
from gateway.observability.telemetry import RequestTrace
from gateway.relay.proxy import BODY_LIMIT
from policies.prefill_choice import PrefillChooser
from policies.prefix import total_tokens
from policies.types import Fingerprint

log = logging.getLogger("cachegate")

ROUTING_FIELDS = (
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "routed_dp_rank",
    "data_parallel_rank",
    "disagg_prefill_dp_rank",
)
"""SGLang's ``PDRoutingFields`` (and the deprecated ``data_parallel_rank``): the gateway's to set."""
ROOM_BITS = 63
GRACE_S = 2.0
"""How long a prefill leg may still take after its decode leg answered in full (its answer is on its way)."""


class PrefillFailed(Exception):
    """No prefill partner computed the prompt: every one tried failed before the decode leg's first byte."""

    def __init__(self, detail: str, none_healthy: bool = False) -> None:
        super().__init__(detail)
        self.none_healthy = none_healthy


class PrefillRefused(Exception):
    """The prefill backend refused the request (4xx): its answer is the client's."""

    def __init__(self, status: int, payload: bytes, content_type: bytes) -> None:
        super().__init__(f"prefill answered {status}")
        self.status, self.payload, self.content_type = status, payload, content_type


def leg_bodies(
    body: bytes, host: str, port: int, room: int, decode_rank: int | None, prefill_dp: int
) -> tuple[bytes, bytes]:
    """The prefill leg's and the decode leg's bodies: ``body`` with the routing fields set."""
    data = orjson.loads(body)
    for name in ROUTING_FIELDS:
        data.pop(name, None)
    data["bootstrap_host"], data["bootstrap_port"], data["bootstrap_room"] = host, port, room
    prefill, decode = dict(data), data
    if prefill_dp > 1:
        prefill["routed_dp_rank"] = decode["disagg_prefill_dp_rank"] = room % prefill_dp
    if decode_rank is not None:
        decode["routed_dp_rank"] = decode_rank
    return orjson.dumps(prefill), orjson.dumps(decode)


def _error_event(payload: bytes) -> bool:
    """An SSE or JSON answer carrying SGLang's error object (an aborted prefill streams one)."""
    return b'"error"' in payload and (b'{"error"' in payload or b'"object":"error"' in payload.replace(b" ", b""))


class PrefillLeg:
    """One prefill leg in flight: its task, its outcome, and how it is ended."""

    def __init__(self, hop: PdHop, backend: Backend, rid: str) -> None:
        self.hop, self.backend, self.rid = hop, backend, rid
        self.error: str | None = None
        self.kind = "stream_broken"
        """How it failed, as ``BackendPool.request_failed`` counts it."""
        self.refused: PrefillRefused | None = None
        self.task: asyncio.Task[None] | None = None

    @property
    def failed(self) -> bool:
        return self.task is not None and self.task.done() and (self.error is not None or self.refused is not None)

    def end(self, clean: bool) -> None:
        """The decode leg is over: a clean end lets the prefill answer arrive (``GRACE_S``), else it is closed now."""
        task = self.task
        if task is None or task.done():
            return
        if clean:
            asyncio.get_running_loop().call_later(GRACE_S, task.cancel)
        else:
            task.cancel()

    async def run(self, url: str, headers: dict[str, str], body: bytes, span: UpstreamSpan) -> None:
        status = 0
        try:
            try:
                response = await self.hop.client.send("POST", url, headers, body)
            except asyncio.CancelledError:
                span.failed("cancelled")
                raise
            except httpx.HTTPError as exc:
                span.failed("connect", exc)
                self.kind, self.error = "connect", f"{type(exc).__name__}: {exc}"
                return
            try:
                status = response.status_code
                parts: list[bytes] = []
                size = 0
                while chunk := await response.receive():
                    if chunk is not SILENCE and size < BODY_LIMIT:
                        parts.append(chunk)
                        size += len(chunk)
                payload = b"".join(parts)
            except httpx.HTTPError as exc:
                self.error = f"the prefill answer broke off: {type(exc).__name__}"
                return
            finally:
                response.close()
                span.done(status, self.error and "stream_broken")
            if 400 <= status < 500:
                ctype = response.headers.get("content-type", "application/json").encode()
                self.refused = PrefillRefused(status, payload, ctype)
            elif status != 200:
                self.kind, self.error = "status_5xx", f"answered {status}"
            elif _error_event(payload):
                self.error = "an error event"
        finally:
            self.hop.chooser.finished(self.rid, self.backend.name)
            if self.error is not None:
                self.hop.pool.request_failed(self.backend, self.kind, f"prefill leg: {self.error}")
                if self.hop.metrics is not None:
                    self.hop.metrics.upstream_errors.labels(self.backend.name, f"prefill_{self.kind}").inc()
            elif self.refused is None and status == 200:
                self.hop.pool.request_ok(self.backend)


class PdHop:
    """The PD legs of one worker: its client, the pool, the prefill chooser (see the module docstring)."""

    def __init__(
        self,
        client: WireClient,
        pool: BackendPool,
        metrics: Metrics | None = None,
        timeout_s: float = 60.0,
        chooser: PrefillChooser | None = None,
    ) -> None:
        self.client, self.pool, self.metrics, self.timeout_s = client, pool, metrics, timeout_s
        self.chooser = chooser or PrefillChooser()
        self._aliases = frozenset(alias for alias in pool.models if pool.prefills(alias))

    def disaggregated(self, alias: str) -> bool:
        """On every request's path: a set lookup (the pool's models are fixed when it is built)."""
        return alias in self._aliases

    def _partner(self, alias: str, fp: Fingerprint, tokens: int, tried: set[str]) -> tuple[Backend, int] | None:
        candidates = [b for b in self.pool.prefills(alias) if b.healthy and b.name not in tried]
        for b in candidates:
            self.chooser.set_capacity(b.name, b.max_total_num_tokens)
        pick = self.chooser.pick([b.name for b in candidates], fp, tokens)
        if pick is None:
            return None
        return next(b for b in candidates if b.name == pick.backend), pick.matched_tokens

    async def send(
        self,
        rid: str,
        alias: str,
        fp: Fingerprint,
        rank: int | None,
        url: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        trace: RequestTrace,
    ) -> tuple[WireResponse, PrefillLeg]:
        """Both legs of one attempt on the decode backend at ``url``: the decode leg's response once its
        first body byte is there (or it ended), and the prefill leg to end with it."""
        tokens = total_tokens(fp)
        tried: set[str] = set()
        errors: list[str] = []
        while True:
            partner = self._partner(alias, fp, tokens, tried)
            if partner is None:
                if not tried:
                    raise PrefillFailed(f"no healthy prefill backend for model '{alias}'", none_healthy=True)
                raise PrefillFailed("; ".join(errors))
            prefill, matched = partner
            tried.add(prefill.name)
            room = secrets.randbits(ROOM_BITS)
            host = urlsplit(prefill.url).hostname or ""
            port = prefill.config.bootstrap_port or 0
            prefill_body, decode_body = leg_bodies(body, host, port, room, rank, prefill.dp_size)
            leg = PrefillLeg(self, prefill, f"{rid}:{room}")  # a retried turn's legs are counted apart
            self.chooser.started(leg.rid, prefill.name, fp, tokens, matched)
            prefill_headers = {**headers, **prefill.headers()}
            prefill_url = prefill.url + path
            span = trace.upstream(prefill.name, prefill_url, prefill_headers)
            if span.span is not None:
                span.span.set_attribute("cachegate.pd.leg", "prefill")
                span.span.set_attribute("cachegate.pd.bootstrap_room", room)
            leg.task = asyncio.create_task(leg.run(prefill_url, prefill_headers, prefill_body, span))
            try:
                response = await self._gate(url, headers, decode_body, leg)
            except PrefillFailed as exc:
                log.warning("request %s: prefill leg on %s failed (%s); trying another partner", rid, prefill.name, exc)
                errors.append(f"{prefill.name}: {exc}")
                continue
            except asyncio.CancelledError:
                leg.end(clean=False)
                raise
            except BaseException as exc:
                log.warning("request %s: decode leg failed before its first byte (%r); prefill leg closed", rid, exc)
                leg.end(clean=False)
                raise
            if response.status_code != 200:
                leg.end(clean=False)
            return response, leg

    async def _gate(self, url: str, headers: dict[str, str], body: bytes, leg: PrefillLeg) -> WireResponse:
        """The decode leg's response, let through once it has body bytes (or ended) or the prefill leg
        answered; a prefill leg that fails first, or hands nothing over within ``timeout_s``, closes it
        (``PrefillFailed``, ``PrefillRefused``)."""
        assert leg.task is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        decode = asyncio.create_task(self.client.send("POST", url, headers, body))
        try:
            await asyncio.wait((decode, leg.task), timeout=self.timeout_s, return_when=asyncio.FIRST_COMPLETED)
            if leg.task.done() and not leg.failed and not decode.done():
                return await decode  # the prefill leg answered: the KV is on the decode backend
            if decode.done():
                response = decode.result()
                if response.status_code != 200 or leg.task.done():
                    return self._checked(response, leg)
                readable = asyncio.create_task(response.readable())
                try:
                    await asyncio.wait(
                        (readable, leg.task),
                        timeout=max(0.0, deadline - loop.time()),
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    readable.cancel()
                if response.out or response.done or response.error is not None or leg.task.done():
                    return self._checked(response, leg)
                response.close()
            if not leg.task.done():  # neither leg moved in time: the prefill hangs
                leg.kind, leg.error = "timeout", f"no handover within {self.timeout_s:g} s"
                leg.task.cancel()
        except BaseException:
            await _cancel(decode)
            raise
        await _cancel(decode)  # the prefill leg failed (or hung) first
        raise leg.refused or PrefillFailed(leg.error or "failed")

    @staticmethod
    def _checked(response: WireResponse, leg: PrefillLeg) -> WireResponse:
        if leg.failed and not (response.out or response.done):  # failed before a decode byte: close it
            response.close()
            raise leg.refused or PrefillFailed(leg.error or "failed")
        return response


async def _cancel(task: asyncio.Task[WireResponse]) -> None:
    """Cancel a decode send (its connection closes: SGLang aborts the request) or close its response."""
    if not task.done():
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        return
    if not task.cancelled() and task.exception() is None:
        task.result().close()

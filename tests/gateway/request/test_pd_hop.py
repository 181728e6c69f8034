"""gateway/request/pd_hop.py over real sockets: scripted prefill and decode servers (raw asyncio HTTP/1.1),
each recording what it got and when its connection closed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson
import pytest

from backends.pool import BackendPool
from gateway.config.schema import load_config
from gateway.http.wire_pool import WireClient
from gateway.observability.spans import NULL_TRACE
from gateway.request.pd_hop import PdHop, PrefillFailed, PrefillRefused

FP = ((1, 100), (2, 100))
BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "bootstrap_room": 1})


@dataclass
class Scripted:
    """One upstream: ``answer(writer)`` writes its response (or never does)."""

    answer: Callable[[asyncio.StreamWriter], Awaitable[None]]
    bodies: list[dict[str, object]] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0
    server: asyncio.Server | None = None

    async def start(self) -> Scripted:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
        self.bodies.append(orjson.loads(await reader.readexactly(length)))
        try:
            await self.answer(writer)
            await reader.read()  # until the gateway closes the connection
        finally:
            self.closed.set()
            writer.close()


def respond(
    status: int, body: dict[str, object], delay_s: float = 0.0
) -> Callable[[asyncio.StreamWriter], Awaitable[None]]:
    async def answer(writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(delay_s)
        payload = orjson.dumps(body)
        writer.write(
            b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (status, len(payload), payload)
        )
        await writer.drain()

    return answer


async def never(writer: asyncio.StreamWriter) -> None:
    """No answer: the server only waits for the gateway to close the connection."""


OK = respond(200, {"choices": [{"finish_reason": "length"}], "usage": {"prompt_tokens": 2, "completion_tokens": 1}})


async def _hop(prefills: list[Scripted], decode: Scripted, timeout_s: float = 5.0) -> tuple[PdHop, BackendPool]:
    backends = [
        {"url": f"http://127.0.0.1:{p.port}", "role": "prefill", "bootstrap_port": 9000 + i}
        for i, p in enumerate(prefills)
    ]
    backends.append({"url": f"http://127.0.0.1:{decode.port}", "role": "decode"})
    pool = BackendPool(load_config(None, backends=backends, model="m"), polled=False)  # type: ignore[arg-type]
    for b in pool.all():
        b.health_ok = True
    return PdHop(WireClient(1.0, 30.0, 3.0, 64), pool, timeout_s=timeout_s), pool


def _send(hop: PdHop, decode: Scripted):  # type: ignore[no-untyped-def]
    return hop.send(
        "r1",
        "m",
        FP,
        None,
        f"http://127.0.0.1:{decode.port}/v1/chat/completions",
        "/v1/chat/completions",
        {},
        BODY,
        NULL_TRACE,
    )


def test_both_legs_get_the_fields_and_the_decode_answer_comes_back() -> None:
    async def run() -> None:
        prefill, decode = await Scripted(OK).start(), await Scripted(respond(200, {"ok": True}, 0.05)).start()
        hop, _ = await _hop([prefill], decode)
        response, leg = await _send(hop, decode)
        assert response.status_code == 200 and orjson.loads(await response.receive() or b"{}") == {"ok": True}
        response.close()
        leg.end(clean=True)
        p, d = prefill.bodies[0], decode.bodies[0]
        assert p["bootstrap_room"] == d["bootstrap_room"] != 1  # the client's room dropped, one room for both
        assert (
            (p["bootstrap_host"], p["bootstrap_port"])
            == (d["bootstrap_host"], d["bootstrap_port"])
            == ("127.0.0.1", 9000)
        )
        assert 0 <= int(p["bootstrap_room"]) < 1 << 63  # type: ignore[call-overload]
        await asyncio.wait_for(leg.task, 1)  # type: ignore[arg-type]
        assert hop.chooser.legs(f"127.0.0.1:{prefill.port}") == 0

    asyncio.run(run())


def test_a_refused_prefill_closes_the_decode_leg_and_is_the_answer() -> None:
    async def run() -> None:
        prefill = await Scripted(respond(400, {"object": "error", "message": "too long", "code": 400})).start()
        decode = await Scripted(never).start()
        hop, _ = await _hop([prefill], decode)
        with pytest.raises(PrefillRefused) as refused:
            await _send(hop, decode)
        assert refused.value.status == 400 and b"too long" in refused.value.payload
        await asyncio.wait_for(decode.closed.wait(), 2)  # the decode leg no longer waits

    asyncio.run(run())


def test_a_dead_prefill_is_replaced_by_another_and_the_first_decode_leg_closed() -> None:
    async def run() -> None:
        dead = await Scripted(never).start()
        assert dead.server is not None
        dead.server.close()  # refuses connections from now on
        await dead.server.wait_closed()
        live = await Scripted(OK).start()
        decode = await Scripted(respond(200, {"ok": True}, 0.2)).start()
        hop, pool = await _hop([dead, live], decode)
        response, leg = await _send(hop, decode)
        response.close()
        leg.end(clean=True)
        assert [b["bootstrap_port"] for b in decode.bodies] == [9000, 9001]  # the first pair, then the second
        assert not pool.get("m", f"127.0.0.1:{dead.port}").healthy  # a refused connection trips its breaker

    asyncio.run(run())


def test_a_hung_prefill_is_given_up_after_the_timeout_and_both_legs_closed() -> None:
    async def run() -> None:
        prefill, decode = await Scripted(never).start(), await Scripted(never).start()
        hop, _ = await _hop([prefill], decode, timeout_s=0.3)
        with pytest.raises(PrefillFailed, match=r"no handover within 0\.3 s"):
            await _send(hop, decode)
        await asyncio.wait_for(asyncio.gather(prefill.closed.wait(), decode.closed.wait()), 2)

    asyncio.run(run())


def test_no_healthy_prefill_sends_nothing() -> None:
    async def run() -> None:
        prefill, decode = await Scripted(OK).start(), await Scripted(OK).start()
        hop, pool = await _hop([prefill], decode)
        pool.get("m", f"127.0.0.1:{prefill.port}").health_ok = False
        with pytest.raises(PrefillFailed) as failed:
            await _send(hop, decode)
        assert failed.value.none_healthy and not decode.bodies and not prefill.bodies

    asyncio.run(run())


def test_a_client_that_leaves_closes_both_legs() -> None:
    async def run() -> None:
        prefill, decode = await Scripted(never).start(), await Scripted(never).start()
        hop, _ = await _hop([prefill], decode)
        task = asyncio.create_task(_send(hop, decode))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(asyncio.gather(prefill.closed.wait(), decode.closed.wait()), 2)
        assert hop.chooser.legs(f"127.0.0.1:{prefill.port}") == 0

    asyncio.run(run())

"""The bootstrap fields the gateway writes, checked against SGLang 0.5.23's own protocol models
(``PDRoutingFields``; needs ``pip install --no-deps sglang==0.5.23``, the Makefile's install step)."""

from __future__ import annotations

import orjson

from backends.sim import sglang_ref
from backends.sim.disagg import NO_ROOM, check_fields
from gateway.request.pd_hop import ROOM_BITS, ROUTING_FIELDS, leg_bodies

P = sglang_ref.load_protocol()


def test_the_routing_fields_are_sglangs() -> None:
    assert set(P.PDRoutingFields.model_fields) == set(ROUTING_FIELDS) - {"data_parallel_rank"}
    for request in (P.ChatCompletionRequest, P.CompletionRequest, P.ResponsesRequest):
        assert issubclass(request, P.PDRoutingFields)


def test_injected_bodies_validate_as_sglang_requests_and_drop_the_clients_fields() -> None:
    client = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "bootstrap_room": 5,
        "bootstrap_host": "evil",
        "data_parallel_rank": 3,
    }
    room = (1 << ROOM_BITS) - 1
    prefill, decode = (orjson.loads(b) for b in leg_bodies(orjson.dumps(client), "10.0.0.5", 8998, room, 2, 4))
    for body in (prefill, decode):
        parsed = P.ChatCompletionRequest.model_validate(body)
        assert (parsed.bootstrap_host, parsed.bootstrap_port, parsed.bootstrap_room) == ("10.0.0.5", 8998, room)
        assert "data_parallel_rank" not in body and check_fields(body) == []
    assert prefill["routed_dp_rank"] == room % 4 and "disagg_prefill_dp_rank" not in prefill
    assert (decode["routed_dp_rank"], decode["disagg_prefill_dp_rank"]) == (2, room % 4)
    plain_prefill, plain_decode = (orjson.loads(b) for b in leg_bodies(orjson.dumps(client), "h", 1, 7, None, 1))
    assert not {"routed_dp_rank", "disagg_prefill_dp_rank"} & (set(plain_prefill) | set(plain_decode))


def test_the_refusal_message_is_sglangs() -> None:
    scheduler = (sglang_ref.sglang_root() / "srt" / "managers" / "scheduler.py").read_text()
    assert '"Invalid request: Disaggregated request received without "' in scheduler
    assert NO_ROOM.startswith("Invalid request: Disaggregated request received without bootstrap room id.")

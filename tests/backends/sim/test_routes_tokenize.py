"""backends/sim/routes_tokenize.py: ``POST /v1/tokenize`` (and ``/tokenize``): a prompt or chat messages
rendered as a chat completion would be, 4-byte tokens whose ids are those bytes, and its 400s."""

from __future__ import annotations

import pytest

from backends.sim.chat_template import render_chat
from backends.sim.routes_tokenize import token_ids
from backends.sim.tokenizer import count_tokens, text_blocks
from tests.backends.sim.twin_asgi import USER, twin_app

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


def test_token_ids_are_the_texts_bytes_as_little_endian_uint32_the_last_zero_padded() -> None:
    assert token_ids("") == []
    assert token_ids("abcd") == [int.from_bytes(b"abcd", "little")]
    assert token_ids("abcdef") == [int.from_bytes(b"abcd", "little"), int.from_bytes(b"ef\0\0", "little")]
    text = "héllo wörld, a prompt"
    assert len(token_ids(text)) == count_tokens(text)


async def test_a_prompt_is_tokenized_as_it_is() -> None:
    async with twin_app() as (_, _t, c):
        for path in ("/v1/tokenize", "/tokenize"):
            r = (await c.post(path, json={"prompt": "abcdefgh"})).json()
            assert r == {"tokens": token_ids("abcdefgh"), "count": 2, "max_model_len": 262_144}


async def test_messages_are_rendered_with_the_chat_template_and_tools() -> None:
    async with twin_app() as (_, _t, c):
        r = (await c.post("/v1/tokenize", json={"messages": USER, "tools": TOOLS})).json()
        prompt = render_chat(USER, TOOLS)
        assert r["tokens"] == token_ids(prompt) and r["count"] == count_tokens(prompt)
        bare = (await c.post("/v1/tokenize", json={"messages": USER, "add_generation_prompt": False})).json()
        assert bare["tokens"] == token_ids(render_chat(USER, None, add_generation_prompt=False))
        assert bare["count"] < count_tokens(render_chat(USER, None))


async def test_its_tokens_are_the_prompt_a_chat_request_caches() -> None:
    """The counts agree with what the engine is given: the same text makes the same prompt blocks."""
    async with twin_app() as (_, t, c):
        counted = (await c.post("/v1/tokenize", json={"messages": USER})).json()["count"]
        usage = (await c.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 1})).json()["usage"]
        assert usage["prompt_tokens"] == counted
        page = t.profile.page_size
        assert sum(n for _, n in text_blocks(render_chat(USER, None), page)) == counted


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"{not json", "Invalid JSON body"),
        (b'"text"', "valid dictionary"),
        (b'{"prompt": 5}', "Either prompt or messages is required"),
        (b'{"messages": [{"content": "x"}]}', "Each message needs a role"),
    ],
)
async def test_what_it_cannot_tokenize_is_a_400(raw: bytes, match: str) -> None:
    async with twin_app() as (_, _t, c):
        r = await c.post("/v1/tokenize", content=raw)
        assert r.status_code == 400 and r.json()["type"] == "Bad Request" and match in r.json()["message"]

"""The prefix fingerprint (policies/prefix.py); the per-slot index over it is tests/policies/test_prefix_index.py."""

from __future__ import annotations

import copy
import random

import pytest

from policies.prefix import (
    BLOCK_BYTES,
    fingerprint,
    from_blocks,
    held_blocks,
    render,
    request_fingerprint,
    total_tokens,
)

RATIO = 0.25


def _text(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choices("abcdefghij klmnop\n{}()", k=n))


def _chat(turns: int = 6) -> dict:
    msgs: list[dict] = [{"role": "system", "content": _text(0, 9000)}]
    for i in range(turns):
        msgs.append({"role": "user", "content": _text(10 + i, 3000 + 100 * i)})
        msgs.append(
            {
                "role": "assistant",
                "content": _text(100 + i, 1500),
                "tool_calls": [
                    {
                        "id": f"call{i}",
                        "type": "function",
                        "function": {"name": "read", "arguments": '{"path": "a.py"}'},
                    }
                ],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"call{i}", "name": "read", "content": _text(200 + i, 2500)})
    return {
        "model": "kimi",
        "messages": msgs,
        "tools": [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}],
    }


def _first_diff(a: bytes, b: bytes) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


# -- fingerprint ---------------------------------------------------------------------------------


def test_same_request_same_fingerprint() -> None:
    body = _chat()
    fp1, n1 = request_fingerprint(body, RATIO)
    fp2, n2 = request_fingerprint(copy.deepcopy(body), RATIO)
    assert fp1 == fp2 and n1 == n2
    assert len(fp1) == -(-n1 // BLOCK_BYTES)
    # Key order inside tools and tool calls does not matter (sorted JSON).
    body3 = copy.deepcopy(body)
    body3["tools"] = [{"function": {"parameters": {"type": "object"}, "name": "read"}, "type": "function"}]
    assert request_fingerprint(body3, RATIO)[0] == fp1


@pytest.mark.parametrize("index", [1, 7, 12, 18])
def test_changed_message_changes_only_blocks_from_it_on(index: int) -> None:
    body = _chat()
    changed = copy.deepcopy(body)
    msg = changed["messages"][index]
    msg["content"] = msg["content"][:200] + "X" + msg["content"][201:]
    a, b = render(body), render(changed)
    cut = _first_diff(a, b)
    fa, fb = fingerprint(a, RATIO), fingerprint(b, RATIO)
    first_changed = cut // BLOCK_BYTES
    assert fa[:first_changed] == fb[:first_changed]
    assert all(x[0] != y[0] for x, y in zip(fa[first_changed:], fb[first_changed:], strict=True))
    assert first_changed > 0


def test_every_message_and_field_counts_not_only_the_first() -> None:
    body = _chat()
    base = request_fingerprint(body, RATIO)[0]
    edits = [
        lambda b: b["messages"][-1].__setitem__("content", "different tool output"),
        lambda b: b["messages"][-2]["tool_calls"][0]["function"].__setitem__("arguments", '{"path": "b.py"}'),
        lambda b: b["messages"][-1].__setitem__("tool_call_id", "other"),
        lambda b: b["messages"][-1].__setitem__("name", "write"),
        lambda b: b["messages"][-1].__setitem__("role", "user"),
        lambda b: b["tools"][0]["function"].__setitem__("name", "open"),
    ]
    for edit in edits:
        changed = copy.deepcopy(body)
        edit(changed)
        assert request_fingerprint(changed, RATIO)[0] != base


def test_tools_come_first_and_change_everything() -> None:
    body = _chat()
    changed = copy.deepcopy(body)
    changed["tools"][0]["function"]["name"] = "open"
    fa, fb = request_fingerprint(body, RATIO)[0], request_fingerprint(changed, RATIO)[0]
    assert all(x[0] != y[0] for x, y in zip(fa, fb, strict=True))


def test_next_turn_keeps_the_previous_full_blocks() -> None:
    body = _chat(turns=3)
    nxt = copy.deepcopy(body)
    nxt["messages"].append({"role": "user", "content": "now run the tests"})
    a, b = request_fingerprint(body, RATIO), request_fingerprint(nxt, RATIO)
    full = a[1] // BLOCK_BYTES
    assert b[0][:full] == a[0][:full]
    assert len(b[0]) >= len(a[0])


def test_content_parts_are_rendered() -> None:
    parts = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "hello " * 100}, {"type": "image_url", "image_url": {"url": "x"}}],
            }
        ]
    }
    other = copy.deepcopy(parts)
    other["messages"][0]["content"][0]["text"] = "hullo " * 100
    img = copy.deepcopy(parts)
    img["messages"][0]["content"][1]["image_url"]["url"] = "y"
    fps = {request_fingerprint(b, RATIO)[0] for b in (parts, other, img)}
    assert len(fps) == 3


@pytest.mark.parametrize("turns", [0, 1, 6])
def test_streamed_fingerprint_equals_fingerprint_of_the_rendering(turns: int) -> None:
    body = _chat(turns)
    body["messages"].append(
        {
            "role": "user",
            "content": [{"type": "text", "text": _text(3, 5000)}, {"type": "image_url", "image_url": {"url": "u"}}],
        }
    )
    body["messages"].append({"role": "assistant", "content": None, "reasoning_content": "hm" * 700})
    for block in (BLOCK_BYTES, 7, 4096):
        fp, n = request_fingerprint(body, 0.3, block)
        data = render(body)
        assert n == len(data)
        assert fp == fingerprint(data, 0.3, block)
    assert request_fingerprint({"messages": []}, RATIO) == ((), 0)


def test_many_small_messages_hash_as_their_rendering() -> None:
    """Small messages are hashed in batches and a long content alone: the bytes are the same."""
    roles = ["user", "assistant", "tool", "critic", 7]
    msgs: list = [{"role": roles[i % 5], "content": _text(i, 40 + i % 300)} for i in range(150)]
    msgs[70]["content"] = _text(1, 5000)
    expected = b"".join(b"\x1e" + str(m["role"]).encode() + b"\x1f" + m["content"].encode() for m in msgs)
    msgs.append(["not", "a", "mapping"])
    expected += b'\x1e["not","a","mapping",]'
    body = {"messages": msgs}
    assert render(body) == expected
    for block in (BLOCK_BYTES, 7, 4096):
        assert request_fingerprint(body, 0.3, block) == (fingerprint(expected, 0.3, block), len(expected))


def test_token_estimates_add_up() -> None:
    data = render(_chat())
    for ratio in (0.25, 0.3, 0.17):
        fp = fingerprint(data, ratio)
        assert total_tokens(fp) == round(len(data) * ratio)
        assert all(n >= 1 for _, n in fp)
    assert fingerprint(b"", RATIO) == ()


def test_completion_prompts() -> None:
    text = _text(5, 5000)
    fp_str, n = request_fingerprint({"prompt": text}, RATIO)
    assert n == len(text.encode())
    fp_longer, _ = request_fingerprint({"prompt": text + "more"}, RATIO)
    assert fp_longer[: n // BLOCK_BYTES] == fp_str[: n // BLOCK_BYTES]
    ids1, _ = request_fingerprint({"prompt": list(range(3000))}, RATIO)
    ids2, _ = request_fingerprint({"prompt": [*range(2999), 7]}, RATIO)
    assert ids1 != ids2 and ids1[0] == ids2[0]
    assert (
        request_fingerprint({"prompt": ["a" * 2000, "b"]}, RATIO)[0]
        != request_fingerprint({"prompt": ["a" * 2000, "c"]}, RATIO)[0]
    )


def test_from_blocks_keeps_simulator_blocks() -> None:
    blocks = [(11, 512), (22, 512), (33, 97)]
    assert from_blocks(blocks) == ((11, 512), (22, 512), (33, 97))


def test_held_blocks_counts_the_leading_blocks_held() -> None:
    fp = ((1, 10), (2, 10), (3, 10), (4, 5))
    assert held_blocks(fp, set()) == 0
    assert held_blocks(fp, {1, 2}) == 2
    assert held_blocks(fp, {1, 2, 3, 4, 99}) == 4
    assert held_blocks((), {1}) == 0
    assert total_tokens(fp) == 35 and total_tokens(()) == 0


def test_held_blocks_is_a_binary_search() -> None:
    """Keys are chained, so what is held of a prompt is a prefix of it: ``log2(n)`` lookups, not ``n``."""

    class Counting(set):
        lookups = 0

        def __contains__(self, key: object) -> bool:
            Counting.lookups += 1
            return super().__contains__(key)

    fp = tuple((k, 256) for k in range(1024))
    held = Counting(range(700))
    assert held_blocks(fp, held) == 700
    assert Counting.lookups <= 11


def test_small_json_values_are_canonical() -> None:
    def fp(call: dict) -> tuple:
        body = {"messages": [{"role": "assistant", "content": "x" * 3000, "tool_calls": [call]}]}
        return request_fingerprint(body, RATIO)[0]

    base = {"id": "c", "index": 0, "ok": True, "extra": None, "w": 0.5, "f": {"name": "n", "arguments": "{}"}}
    reordered = dict(reversed(list(base.items())))
    assert fp(base) == fp(reordered)
    for key, value in (("index", 1), ("ok", False), ("extra", 0), ("w", 0.25), ("f", {"name": "m"})):
        assert fp({**base, key: value}) != fp(base)

"""policies/engine_blocks.py: SGLang 0.5.23's KV block hashes of token ids, and fingerprint blocks
aligned to engine pages."""

from __future__ import annotations

import ast
import hashlib
import struct
from collections.abc import Callable

import pytest

from policies.engine_blocks import align_blocks, digest_to_block_hash, pack_tokens, page_digests, token_block_hashes


def _sglang_hash_str_to_int64() -> Callable[[str], int]:
    """SGLang's own ``hash_str_to_int64`` (``srt/mem_cache/utils.py``), read from the installed source."""
    from backends.sim import sglang_ref

    # make install puts SGLang's source in the venv (no deps): its absence is a failure, not a skip
    source = (sglang_ref.sglang_root() / "srt" / "mem_cache" / "utils.py").read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "hash_str_to_int64")
    namespace: dict[str, object] = {}
    exec(compile(ast.Module([node], []), "sglang_utils", "exec"), namespace)
    return namespace["hash_str_to_int64"]  # type: ignore[return-value]


def test_sglang_block_hash_chain() -> None:
    """SHA-256 over (prior digest ‖ uint32 little-endian ids), int64 of the first 8 bytes, big-endian."""
    ids = list(range(10))
    d0 = hashlib.sha256(struct.pack("<4I", *ids[:4])).digest()
    d1 = hashlib.sha256(d0 + struct.pack("<4I", *ids[4:8])).digest()
    assert token_block_hashes(ids, 4) == [digest_to_block_hash(d0), digest_to_block_hash(d1)]
    # SGLang's hash_str_to_int64 on the hex digest gives the same integer
    hx = d0.hex()
    u = int(hx[:16], 16)
    assert digest_to_block_hash(d0) == (u - 2**64 if u >= 2**63 else u)


def test_digest_to_block_hash_is_sglangs_hash_str_to_int64() -> None:
    hash_str_to_int64 = _sglang_hash_str_to_int64()
    digests = [hashlib.sha256(str(i).encode()).digest() for i in range(200)]
    digests += [b"\xff" * 32, b"\x80" + b"\x00" * 31, b"\x7f" + b"\xff" * 31, b"\x00" * 32]
    for d in digests:
        assert digest_to_block_hash(d) == hash_str_to_int64(d.hex())
    signs = {digest_to_block_hash(d) < 0 for d in digests}
    assert signs == {True, False}  # both halves of the int64 range occur
    assert digest_to_block_hash(b"\xff" * 32) == -1 and digest_to_block_hash(b"\x80" + b"\x00" * 31) == -(2**63)


def test_tokens_are_packed_as_little_endian_uint32() -> None:
    assert pack_tokens([1, 256, 2**32 - 1]) == b"\x01\x00\x00\x00" + b"\x00\x01\x00\x00" + b"\xff\xff\xff\xff"
    assert pack_tokens([]) == b""
    with pytest.raises(struct.error):
        pack_tokens([2**32])  # ids beyond uint32 are not modelled: refused, not wrapped


def test_page_digests_chain_from_a_prior() -> None:
    pages = [pack_tokens([1, 2]), pack_tokens([3, 4])]
    plain = page_digests(pages)
    assert plain[0] == hashlib.sha256(pages[0]).digest()
    assert plain[1] == hashlib.sha256(plain[0] + pages[1]).digest()
    assert page_digests(pages[1:], prior=plain[0]) == plain[1:]  # a continuation from a known page
    assert page_digests([]) == []


def test_only_full_pages_are_hashed() -> None:
    assert token_block_hashes([1, 2, 3], 4) == []
    assert len(token_block_hashes(list(range(15)), 4)) == 3
    assert token_block_hashes(list(range(15)), 4) == token_block_hashes(list(range(12)), 4)
    assert len(token_block_hashes(list(range(7)), 1)) == 7
    with pytest.raises(ValueError, match="page_size"):
        token_block_hashes([1, 2], 0)


def test_a_changed_token_changes_its_page_and_every_later_one() -> None:
    ids = list(range(64))
    base = token_block_hashes(ids, 16)
    changed = list(ids)
    changed[20] = 999  # in page 1
    other = token_block_hashes(changed, 16)
    assert other[0] == base[0]
    assert all(a != b for a, b in zip(other[1:], base[1:], strict=True))
    assert token_block_hashes(ids[:32], 16) == base[:2]  # a prefix's hashes are a prefix


def test_align_blocks_maps_each_block_one_page_before_its_proportional_end() -> None:
    fp = [(10, 256), (11, 256), (12, 256), (13, 120)]
    hashes = list(range(1000, 1062))  # 1,000 tokens in pages of 16: 62 pages
    pairs = align_blocks(fp, rendered_bytes=3500, block_bytes=1024, tokens=1000, page_size=16, hashes=hashes)
    # block i ends at min((i+1)·1024, 3500) bytes → that fraction of 1,000 tokens → its page, less 2
    expected = [(10, 1016), (11, 1034), (12, 1052), (13, 1060)]
    assert pairs == expected


def test_align_blocks_clamps_to_the_last_hash_and_skips_blocks_before_the_first_page() -> None:
    fp = [(1, 256), (2, 256), (3, 256), (4, 256)]
    few = [7, 8, 9]
    pairs = align_blocks(fp, rendered_bytes=4096, block_bytes=1024, tokens=1000, page_size=16, hashes=few)
    assert [h for _, h in pairs] == [9, 9, 9, 9]  # every mapped page is past the hashes known: the last one
    early = align_blocks(fp, rendered_bytes=4096, block_bytes=1024, tokens=100, page_size=16, hashes=list(range(6)))
    assert early == [(2, 1), (3, 2), (4, 4)]  # block 1 ends 25 tokens in: before page 0, with the margin


def test_align_blocks_without_figures_maps_nothing() -> None:
    fp = [(1, 256)]
    assert align_blocks(fp, 0, 1024, 1000, 16, [1, 2]) == []
    assert align_blocks(fp, 1024, 1024, 0, 16, [1, 2]) == []
    assert align_blocks(fp, 1024, 1024, 1000, 16, []) == []
    assert align_blocks([], 1024, 1024, 1000, 16, [1, 2]) == []

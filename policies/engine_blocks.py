"""SGLang's KV block hashes, computed from token ids as SGLang 0.5.23 computes them.

Read from ``srt/mem_cache/cpp_utils/hash_binding.cpp`` (``hash_pages_to_hex_blob``), ``mem_cache/utils.py``
(``get_hash_str``, ``hash_str_to_int64``) and ``mem_cache/events.py`` (``record_store``): the prompt is cut
into pages of ``page_size`` tokens (SGLang's ``--page-size``); page i's digest is
``SHA-256(digest of page i−1 ‖ its token ids as little-endian uint32)`` (page 0 has no prior digest, when
the request has neither LoRA ``extra_key`` nor ``cache_salt``); the published block hash is the digest's
first 8 bytes read big-endian as a signed 64-bit integer (``int(hex[:16], 16)`` folded into int64). A
radix node only holds whole pages (``page_aligned_len``), so only full pages are ever published.

Pure functions: the twin uses them to publish, the gateway to turn an engine's token ids into the
block hashes its events speak of.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence


def digest_to_block_hash(digest: bytes) -> int:
    """SGLang's ``hash_str_to_int64`` of a digest: its first 8 bytes, big-endian, as a signed int64."""
    return int.from_bytes(digest[:8], "big", signed=True)


def page_digests(pages: Sequence[bytes], prior: bytes | None = None) -> list[bytes]:
    """The chained SHA-256 digests of pages already packed as uint32 little-endian token ids."""
    out: list[bytes] = []
    for page in pages:
        h = hashlib.sha256(prior) if prior is not None else hashlib.sha256()
        h.update(page)
        prior = h.digest()
        out.append(prior)
    return out


def pack_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids as SGLang hashes them: uint32, little-endian (ids beyond uint32 are not modelled)."""
    return struct.pack(f"<{len(token_ids)}I", *token_ids)


def token_block_hashes(token_ids: Sequence[int], page_size: int) -> list[int]:
    """Block hashes of the full pages of ``token_ids`` (what a ``BlockStored`` chain of them carries)."""
    if page_size < 1:
        raise ValueError("page_size must be >= 1")
    full = len(token_ids) // page_size * page_size
    data = pack_tokens(token_ids[:full])
    step = 4 * page_size
    pages = [data[i : i + step] for i in range(0, len(data), step)]
    return [digest_to_block_hash(d) for d in page_digests(pages)]


def align_blocks(
    fp: Sequence[tuple[int, int]],
    rendered_bytes: int,
    block_bytes: int,
    tokens: int,
    page_size: int,
    hashes: Sequence[int],
) -> list[tuple[int, int]]:
    """(fingerprint key, engine block hash) pairs: fingerprint block i (its rendering's bytes up to
    ``min((i+1)·block_bytes, rendered_bytes)``) is mapped to the last whole engine page ending at or before
    the same fraction of the engine's ``tokens``, one page earlier as a margin (the two renderings — the
    gateway's canonical one and the engine's chat template — are only proportional, not aligned). A block
    whose page would be before the first is left unmapped."""
    if rendered_bytes <= 0 or tokens <= 0 or not hashes:
        return []
    out: list[tuple[int, int]] = []
    for i, (key, _) in enumerate(fp):
        end = min((i + 1) * block_bytes, rendered_bytes)
        j = (end * tokens // rendered_bytes) // page_size - 2
        if j >= 0:
            out.append((key, hashes[min(j, len(hashes) - 1)]))
    return out


__all__ = ["align_blocks", "digest_to_block_hash", "pack_tokens", "page_digests", "token_block_hashes"]

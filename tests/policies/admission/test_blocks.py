"""policies/admission/blocks.py: reference counts of the prompt blocks a slot's seats hold, so that a
shared prefix is reserved once."""

from __future__ import annotations

from policies.admission.blocks import SlotBlocks
from policies.types import Fingerprint

B = 100  # tokens per block in these fingerprints


def fp(*blocks: int) -> Fingerprint:
    """Chained blocks named by ints, ``B`` tokens each (a key stands for the whole prefix up to it)."""
    return tuple((hash(("chain", *blocks[: i + 1])), B) for i in range(len(blocks)))


def test_slot_blocks_count_shared_blocks_once() -> None:
    b = SlotBlocks()
    a, c = fp(1, 2, 3), fp(1, 2, 4)
    assert b.add(a) == 0
    assert b.add(c) == 2 * B  # blocks 1 and 2 were held already
    assert b.held_prefix(fp(1, 2, 5)) == 2 * B
    assert b.held_prefix(fp(1, 2, 3, 6)) == 3 * B
    assert b.held_prefix(fp(7)) == 0
    assert b.shared_of(a) == 2 * B
    assert b.remove(a) == 2 * B  # 1 and 2 stay held by c
    assert b.shared_of(c) == 0
    assert b.remove(c) == 0
    assert b.refs == {}


def test_the_same_prompt_twice_is_shared_whole() -> None:
    b = SlotBlocks()
    a = fp(1, 2, 3)
    assert b.add(a) == 0
    assert b.add(a) == 3 * B
    assert b.add(a) == 3 * B
    assert set(b.refs.values()) == {3}
    assert b.shared_of(a) == 3 * B
    assert b.remove(a) == 3 * B and b.remove(a) == 3 * B  # one holder is left
    assert b.shared_of(a) == 0 and set(b.refs.values()) == {1}
    assert b.remove(a) == 0 and b.refs == {}  # the last holder keeps nothing for others


def test_an_empty_slot_and_an_empty_prompt_hold_nothing() -> None:
    b = SlotBlocks()
    assert b.held_prefix(fp(1)) == 0 and b.held_prefix(()) == 0
    assert b.add(()) == 0 and b.remove(()) == 0 and b.shared_of(()) == 0
    b.add(fp(1))
    assert b.held_prefix(()) == 0


def test_removing_what_was_never_added_changes_nothing() -> None:
    b = SlotBlocks()
    b.add(fp(1, 2))
    assert b.remove(fp(8, 9)) == 0
    assert b.refs == {k: 1 for k, _ in fp(1, 2)}
    assert b.remove(fp(1, 2, 3)) == 0  # its third block was never held: no negative count is kept
    assert b.refs == {}


def test_held_prefix_stops_at_the_first_block_not_held() -> None:
    b = SlotBlocks()
    b.add(fp(1, 2, 3, 4))
    assert b.held_prefix(fp(1, 2, 3, 4, 5, 6)) == 4 * B
    assert b.held_prefix(fp(1, 2, 9)) == 2 * B  # diverges after two blocks
    assert b.held_prefix(fp(2, 3)) == 0  # another chain: its first block is not held
    held = fp(1, 2)
    uneven = ((held[0][0], 37), (held[1][0], 1), (fp(1, 2, 7)[2][0], 500))  # the prompt's own token counts
    assert b.held_prefix(uneven) == 38

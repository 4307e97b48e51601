"""Which engine slot serves a request (pure): tenant-safe prefix reuse.

llama-server keeps each slot's KV cache between requests and reuses the common prefix of
the next prompt sent to that slot. Left to itself it picks slots by prompt similarity and
shares a RAM prompt cache across everybody, so one tenant can be served from another's
prompt. The runner turns both off and picks the slot itself (`id_slot`), with this function.

A slot is described by what it last served (`SlotView`): tenant, tag, the start of the
prompt, when it was last used, and whether it is busy now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PREFIX_CHARS = 4096
"""How much of a prompt a slot remembers to compare prefixes (enough for long system prompts)."""


@dataclass(frozen=True, slots=True)
class SlotView:
    slot_id: int
    busy: bool
    tenant: str | None = None  # None: empty (never used, or erased)
    tag: str | None = None
    prefix: str = ""
    last_used: float = float("-inf")


@dataclass(frozen=True, slots=True)
class SlotChoice:
    slot_id: int
    erase: bool  # erase the slot's cache before use: it last served another tenant
    reason: str


def common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # binary search on equal prefixes: C-speed slice compares
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def choose_slot(
    slots: Sequence[SlotView], tenant: str, tag: str | None, prefix: str
) -> SlotChoice | None:
    """Pick the slot for a request of `tenant` (and `tag`) whose prompt starts with `prefix`.

    1. Only free slots count; none free: None (the scheduler never grants beyond the slots).
    2. A free slot of this tenant sharing a prompt prefix with this request: the longest
       shared prefix, ties to the same tag, then the most recently used. Reused as is.
    3. Otherwise an empty slot (never used, or erased), lowest id.
    4. Otherwise the tenant's own least recently used free slot (no prefix in common).
    5. Otherwise the least recently used free slot, erased first: it holds another
       tenant's prompt, which must never be reused by or reported to this one.

    Step 3 comes before 4 (the issue's order has them the other way round) because taking
    an empty slot keeps the tenant's cached prompt for its next turn, at no cost.
    """
    free = [s for s in slots if not s.busy]  # 1
    if not free:
        return None
    mine = [s for s in free if s.tenant == tenant]
    shared = [(common_prefix_len(s.prefix, prefix), s) for s in mine]
    matching = [(n, s) for n, s in shared if n > 0]  # 2
    if matching:
        _, best = max(matching, key=lambda ns: (ns[0], ns[1].tag == tag, ns[1].last_used))
        same_tag = "same tag" if best.tag == tag else "other tag"
        return SlotChoice(best.slot_id, False, f"tenant's slot with a shared prefix ({same_tag})")
    empty = [s for s in free if s.tenant is None]  # 3
    if empty:
        return SlotChoice(min(s.slot_id for s in empty), False, "empty slot")
    if mine:  # 4
        oldest_mine = min(mine, key=lambda s: (s.last_used, s.slot_id))
        return SlotChoice(oldest_mine.slot_id, False, "tenant's least recently used slot")
    oldest = min(free, key=lambda s: (s.last_used, s.slot_id))  # 5
    return SlotChoice(oldest.slot_id, True, "least recently used slot of another tenant")

"""Which engine slot serves a request (pure): tenant-safe prefix reuse.

llama-server keeps each slot's KV cache between requests and reuses the common prefix of
the next prompt sent to that slot. Left to itself it picks slots by prompt similarity and
shares a RAM prompt cache across everybody, so one tenant can be served from another's
prompt. The runner turns both off and picks the slot itself (`id_slot`), with this function.

A slot is described by what it last served (`SlotView`): tenant, adapter, tag, the
start of the prompt, when it was last used, and whether it is busy now. Saved states
(`SavedView`) are a tenant's own, or public: the state of an operator-declared prefix
(`public_prefixes` in the models file) that any tenant's prompt may start from. A public
state holds nothing but the declared text, so a tenant restored from one reuses no more
of anybody's prompt than that text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PREFIX_CHARS = 65536
"""How much of a prompt a slot remembers to compare prefixes: whole conversations, so a
session's own cache is told apart from another session's of the same tenant."""


MIN_SHARED_CHARS = 64
"""A shorter shared start (role markers, a greeting) does not count as a shared prefix."""


@dataclass(frozen=True, slots=True)
class SlotView:
    slot_id: int
    busy: bool
    tenant: str | None = None  # None: empty (never used, or erased)
    tag: str | None = None
    prefix: str = ""
    last_used: float = float("-inf")
    adapter: str = ""  # the adapter its cache was computed with ("": the base model)


@dataclass(frozen=True, slots=True)
class SavedView:
    """A slot's cache saved to the model's prefix cache folder (`prefix_store.py`): a
    tenant's own (`tenant`), or a public prefix's (`public` names it, `tenant` is "").
    A public prefix declared but not saved yet has no `key`: the request that needs it
    first builds it (`SlotChoice.build`)."""

    key: str
    tenant: str
    tag: str | None
    prefix: str
    saved_at: float
    adapter: str = ""
    public: str = ""
    size: int = 0  # bytes on disk


@dataclass(frozen=True, slots=True)
class SlotChoice:
    slot_id: int
    erase: bool  # erase the slot's cache before use: it last served another tenant
    reason: str
    save_first: bool = False  # keep what the slot holds (for its tenant) before reusing it
    restore: str | None = None  # then load this saved cache (the tenant's own, or public)
    build: str | None = None  # or compute this public prefix in it (and save it) first


_BLOCK = 1024


def common_prefix_len(a: str, b: str) -> int:
    """Length of the common prefix, by C-speed slice compares: block by block while the
    blocks agree, then a binary search inside the first block that differs. The work grows
    with the common part only (prompts of 64 KB are compared on every placement)."""
    n = min(len(a), len(b))
    start = 0
    while start < n and a[start : start + _BLOCK] == b[start : start + _BLOCK]:
        start += _BLOCK
    if start >= n:
        return n
    lo, hi = start, min(start + _BLOCK, n)  # a[:lo] agrees; they differ before hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[start:mid] == b[start:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def choose_slot(
    slots: Sequence[SlotView],
    tenant: str,
    tag: str | None,
    prefix: str,
    saved: Sequence[SavedView] = (),
    keep: bool = False,
    adapter: str = "",
) -> SlotChoice | None:
    """Pick the slot for a request of `tenant` (on `adapter`, with `tag`) whose prompt
    starts with `prefix`.

    1. Only free slots count; none free: None (the scheduler never grants beyond the slots).
    2. The candidates, only ever the tenant's own or public, all on the same adapter: its
       free slot sharing the longest prompt prefix with this request (ties to the same
       tag, then the most recently used); with `keep` (the engine saves slots to the
       model's prefix cache; `saved` lists them), its saved cache sharing the longest
       prefix, and every public prefix the prompt starts with in full (saved, or to be
       built). The best saved or public one: the longest shared prefix (ties to the
       tenant's own, the same tag, then the newest).
    3. Its slot shares a prefix (`MIN_SHARED_CHARS` or more) at least as long as the best
       of step 2: reused; with `keep`, saved first when the request leaves the
       conversation the slot holds (so that conversation's cache survives the new one).
    4. Otherwise a slot is taken: an empty slot (lowest id), else the tenant's own least
       recently used slot, else the least recently used slot of another tenant.
    5. With `keep`, a taken slot that holds a cache is saved first (under its own tenant)
       and the best of step 2 goes into it: restored (a restore replaces the whole cache),
       or, a public prefix not saved yet, built there. Otherwise a slot of another tenant
       is erased: its prompt must never be reused by or reported to this one.

    Step 4 takes an empty slot before the tenant's own (the issue's order has them the
    other way round) because it keeps the tenant's cached prompt for its next turn.
    """
    free = [s for s in slots if not s.busy]  # 1
    if not free:
        return None
    own = [
        (common_prefix_len(s.prefix, prefix), s)
        for s in free
        if s.tenant == tenant and s.adapter == adapter
    ]  # 2
    best_own = max(own, key=lambda ns: (ns[0], ns[1].tag == tag, ns[1].last_used), default=None)
    candidates: list[tuple[int, SavedView]] = []
    for v in saved if keep else ():
        if v.adapter != adapter:
            continue
        if v.public:
            if prefix.startswith(v.prefix):
                candidates.append((len(v.prefix), v))
        elif v.tenant == tenant:
            n = common_prefix_len(v.prefix, prefix)
            if n >= MIN_SHARED_CHARS:
                candidates.append((n, v))
    best_saved = max(
        candidates,
        key=lambda nv: (nv[0], not nv[1].public, nv[1].tag == tag, nv[1].saved_at),
        default=None,
    )
    n_saved = best_saved[0] if best_saved is not None else 0
    if best_own is not None and best_own[0] >= max(MIN_SHARED_CHARS, n_saved):  # 3
        n, slot = best_own
        same_tag = "same tag" if slot.tag == tag else "other tag"
        diverges = n < len(slot.prefix)  # the request leaves the cached conversation
        return SlotChoice(
            slot.slot_id,
            False,
            f"tenant's slot with a shared prefix ({same_tag})",
            save_first=keep and diverges,
        )
    empty = [s for s in free if s.tenant is None]  # 4
    if empty:
        target, reason = min(empty, key=lambda s: s.slot_id), "empty slot"
    elif own:
        target = min((s for _, s in own), key=lambda s: (s.last_used, s.slot_id))
        reason = "tenant's least recently used slot"
    else:
        target = min(free, key=lambda s: (s.last_used, s.slot_id))
        reason = "least recently used slot of another tenant"
    other = target.tenant is not None and target.tenant != tenant
    if not keep:  # 5
        return SlotChoice(target.slot_id, other, reason)
    best = best_saved[1] if best_saved is not None else None
    restore = best.key if best is not None and best.key else None
    build = best.public if best is not None and not best.key else None
    if best is not None and best.public:
        reason += f", {'restoring' if restore else 'building'} public prefix {best.public}"
    elif restore is not None:
        reason += ", restoring the tenant's saved cache"
    return SlotChoice(
        target.slot_id,
        other and restore is None and build is None,
        reason,
        save_first=target.tenant is not None,
        restore=restore,
        build=build,
    )

"""Slot placement is pure: same inputs, same slot; never another tenant's cache unerased."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from adapters.llama_server.slots import SavedView, SlotView, choose_slot, common_prefix_len

SYSTEM_A = "You are tenant A's assistant. " * 20
SYSTEM_B = "You are tenant B's assistant. " * 20


def test_choose_slot_none_free_returns_none() -> None:
    """With every slot busy there is no choice to make."""
    assert choose_slot([SlotView(0, busy=True)], "a", None, "x") is None


def test_choose_slot_prefers_tenants_slot_with_longest_prefix() -> None:
    """The tenant's slot sharing the longest prefix wins, without erase."""
    slots = [
        SlotView(0, False, "a", None, SYSTEM_A + "hi", last_used=5),
        SlotView(1, False, "a", None, SYSTEM_A + "session two, turn one", last_used=1),
        SlotView(2, False, None),
    ]
    choice = choose_slot(slots, "a", None, SYSTEM_A + "session two, turn one and more")
    assert choice is not None and (choice.slot_id, choice.erase) == (1, False)


def test_choose_slot_empty_before_erasing_another_tenant() -> None:
    """A new tenant takes an empty slot rather than erasing someone's cache."""
    slots = [SlotView(0, False, "a", None, SYSTEM_A, 1), SlotView(1, False, None)]
    choice = choose_slot(slots, "b", None, SYSTEM_B)
    assert choice is not None and (choice.slot_id, choice.erase) == (1, False)


def test_choose_slot_other_tenants_slot_is_erased_first() -> None:
    """Landing on another tenant's slot erases it; the least recently used one is taken."""
    slots = [
        SlotView(0, False, "a", None, SYSTEM_B, last_used=9),
        SlotView(1, False, "c", None, SYSTEM_B, last_used=2),
        SlotView(2, True, "b", None, SYSTEM_B, last_used=1),
    ]
    choice = choose_slot(slots, "b", None, SYSTEM_B)
    assert choice is not None and (choice.slot_id, choice.erase) == (1, True)


def test_choose_slot_same_tenant_no_prefix_takes_own_lru_without_erase() -> None:
    """No prefix in common and no empty slot: the tenant's own oldest slot, kept unerased."""
    slots = [SlotView(0, False, "a", "t", "zzz", 3), SlotView(1, False, "a", "t", "yyy", 1)]
    choice = choose_slot(slots, "a", "t", "xxx")
    assert choice is not None and (choice.slot_id, choice.erase) == (1, False)


def test_choose_slot_tag_breaks_ties() -> None:
    """Equal prefixes: the slot holding the request's tag wins."""
    slots = [
        SlotView(0, False, "a", "t1", SYSTEM_A, last_used=9),
        SlotView(1, False, "a", "t2", SYSTEM_A, last_used=1),
    ]
    choice = choose_slot(slots, "a", "t2", SYSTEM_A)
    assert choice is not None and choice.slot_id == 1


def test_common_prefix_len_examples() -> None:
    """Common prefix lengths, including empty and identical strings."""
    assert common_prefix_len("", "abc") == 0
    assert common_prefix_len("abc", "abc") == 3
    assert common_prefix_len("abcd", "abxy") == 2


@given(
    st.lists(
        st.tuples(st.booleans(), st.sampled_from([None, "a", "b", "c"]), st.integers(0, 50)),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from(["a", "b", "c"]),
)
def test_choose_slot_never_reuses_other_tenants_cache(
    spec: list[tuple[bool, str | None, int]], tenant: str
) -> None:
    """Whatever the slots, the choice is free, and unerased only if empty or the tenant's own."""
    slots = [SlotView(i, busy, owner, None, "p" * n, n) for i, (busy, owner, n) in enumerate(spec)]
    choice = choose_slot(slots, tenant, None, "pppp")
    if all(s.busy for s in slots):
        assert choice is None
        return
    assert choice is not None
    chosen = slots[choice.slot_id]
    assert not chosen.busy
    if not choice.erase:
        assert chosen.tenant in (None, tenant)


def test_choose_slot_saves_then_restores_the_tenants_own_cache() -> None:
    """Taking another tenant's slot with caches kept: save it, restore this tenant's cache."""
    slots = [SlotView(0, False, "b", None, SYSTEM_B, 1)]
    saved = [
        SavedView("a-old", "a", None, SYSTEM_A + "x", 1.0),
        SavedView("b-own", "b", None, SYSTEM_A, 2.0),  # another tenant's copy of A's prompt
    ]
    choice = choose_slot(slots, "a", None, SYSTEM_A + "turn two", saved, keep=True)
    assert choice is not None
    assert (choice.slot_id, choice.save_first, choice.restore, choice.erase) == (
        0,
        True,
        "a-old",
        False,
    )


def test_choose_slot_never_restores_another_tenants_cache() -> None:
    """Only the other tenant has a matching saved cache: the slot is erased, nothing restored."""
    slots = [SlotView(0, False, "b", None, SYSTEM_B, 1)]
    saved = [SavedView("b-own", "b", None, SYSTEM_A, 2.0)]
    choice = choose_slot(slots, "a", None, SYSTEM_A, saved, keep=True)
    assert choice is not None and (choice.restore, choice.erase, choice.save_first) == (
        None,
        True,
        True,
    )


def test_choose_slot_own_prefix_is_reused_without_save_or_restore() -> None:
    """The tenant's own slot sharing at least as long a prefix as any saved cache is used
    as is."""
    slots = [SlotView(0, False, "a", None, SYSTEM_A + "longer", 1)]
    saved = [SavedView("a-old", "a", None, SYSTEM_A, 2.0)]
    choice = choose_slot(slots, "a", None, SYSTEM_A + "longer still", saved, keep=True)
    assert choice is not None and (choice.save_first, choice.restore) == (False, None)


def test_choose_slot_saved_cache_sharing_more_beats_own_slot() -> None:
    """A saved cache sharing more than the tenant's free slot is restored (into that slot,
    saved first, when no slot is empty)."""
    slots = [SlotView(0, False, "a", None, "system\x00another prompt", 1)]
    saved = [SavedView("a-session", "a", None, SYSTEM_A + "turn one", 2.0)]
    choice = choose_slot(slots, "a", None, SYSTEM_A + "turn one and two", saved, keep=True)
    assert choice is not None
    assert (choice.slot_id, choice.save_first, choice.restore) == (0, True, "a-session")


@given(
    st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=5),
    st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 20)), max_size=6),
    st.sampled_from(["a", "b", "c"]),
)
def test_choose_slot_restores_only_the_requesting_tenants_caches(
    owners: list[str], entries: list[tuple[str, int]], tenant: str
) -> None:
    """Whatever is saved, a restore names a cache of the requesting tenant."""
    slots = [SlotView(i, False, owner, None, "p" * 5, i) for i, owner in enumerate(owners)]
    saved = [SavedView(f"k{i}", t, None, "p" * n, float(i)) for i, (t, n) in enumerate(entries)]
    choice = choose_slot(slots, tenant, None, "pppp", saved, keep=True)
    assert choice is not None
    if choice.restore is not None:
        assert next(v for v in saved if v.key == choice.restore).tenant == tenant
    if not choice.erase and choice.restore is None:
        assert slots[choice.slot_id].tenant in (None, tenant)


@given(st.text(alphabet="ab", max_size=3000), st.text(alphabet="ab", max_size=3000))
def test_common_prefix_len_matches_a_plain_scan(a: str, b: str) -> None:
    """The block-wise search agrees with a character-by-character scan."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_prefix_len(a, b) == n
    assert common_prefix_len(a + "x" * 2048, a + "x" * 1500 + "y") == len(a) + 1500


PUBLIC = "system\x00You are the shared assistant of the platform. Be brief and polite. "


def test_choose_slot_restores_a_public_prefix_on_another_tenants_slot() -> None:
    """A tenant whose prompt starts with a public prefix and who has nothing of its own
    takes another tenant's slot from the public state (saved first, not erased)."""
    slots = [SlotView(0, False, "b", None, PUBLIC + "B's secret", 1)]
    saved = [
        SavedView("pub", "", None, PUBLIC, 1.0, public="ops"),
        SavedView("b-own", "b", None, PUBLIC + "B's secret", 2.0),
    ]
    choice = choose_slot(slots, "a", None, PUBLIC + "B's secret", saved, keep=True)
    assert choice is not None
    assert (choice.save_first, choice.restore, choice.erase) == (True, "pub", False)


def test_choose_slot_builds_a_public_prefix_not_saved_yet() -> None:
    """A declared public prefix with no state yet (no key) is built in the slot taken."""
    saved = [SavedView("", "", None, PUBLIC, 0.0, public="ops")]
    choice = choose_slot([SlotView(0, False)], "a", None, PUBLIC + "hello", saved, keep=True)
    assert choice is not None and (choice.build, choice.restore) == ("ops", None)


def test_choose_slot_public_prefix_only_when_the_prompt_starts_with_it_whole() -> None:
    """A prompt sharing only part of a public prefix does not start from it."""
    saved = [SavedView("pub", "", None, PUBLIC, 1.0, public="ops")]
    choice = choose_slot([SlotView(0, False)], "a", None, PUBLIC[:-5] + "xxxxx", saved, True)
    assert choice is not None and (choice.restore, choice.build) == (None, None)


def test_choose_slot_own_longer_cache_beats_the_public_prefix() -> None:
    """The tenant's own saved conversation, longer than the public prefix, is restored."""
    saved = [
        SavedView("pub", "", None, PUBLIC, 1.0, public="ops"),
        SavedView("a-own", "a", None, PUBLIC + "A's rules and turn one", 2.0),
    ]
    choice = choose_slot(
        [SlotView(0, False)], "a", None, PUBLIC + "A's rules and turn two", saved, True
    )
    assert choice is not None and choice.restore == "a-own"


def test_choose_slot_keeps_adapters_apart() -> None:
    """A slot or state computed with another adapter is never the tenant's own: its own
    slot on adapter x is not reused for adapter y, and a state of adapter x never restored."""
    slots = [SlotView(0, False, "a", None, SYSTEM_A, 1, adapter="x"), SlotView(1, False)]
    saved = [SavedView("a-x", "a", None, SYSTEM_A, 1.0, adapter="x")]
    choice = choose_slot(slots, "a", None, SYSTEM_A, saved, keep=True, adapter="y")
    assert choice is not None and (choice.slot_id, choice.restore) == (1, None)
    mine = choose_slot(slots, "a", None, SYSTEM_A, saved, keep=True, adapter="x")
    assert mine is not None and mine.slot_id == 0


@given(
    st.lists(
        st.tuples(st.sampled_from([None, "a", "b"]), st.integers(0, 30)), min_size=1, max_size=4
    ),
    st.lists(
        st.tuples(st.sampled_from(["a", "b", ""]), st.integers(0, 30), st.sampled_from(["", "x"])),
        max_size=6,
    ),
    st.sampled_from(["a", "b"]),
    st.integers(0, 40),
)
def test_choose_slot_starts_from_nothing_of_another_tenant(
    slot_spec: list[tuple[str | None, int]],
    entries: list[tuple[str, int, str]],
    tenant: str,
    n: int,
) -> None:
    """Whatever the slots and states: the slot the request runs in holds, after the choice
    is carried out, nothing but the tenant's own cache, a public prefix its prompt starts
    with, or nothing; on the same adapter."""
    prompt = "q" * n
    slots = [SlotView(i, False, o, None, "q" * k, i) for i, (o, k) in enumerate(slot_spec)]
    saved = [
        SavedView(
            f"k{i}" if t or i % 2 else "", t, None, "q" * k, float(i), a, "p" if not t else ""
        )
        for i, (t, k, a) in enumerate(entries)
    ]
    choice = choose_slot(slots, tenant, None, prompt, saved, keep=True)
    assert choice is not None
    if choice.restore is not None:
        state = next(v for v in saved if v.key == choice.restore)
        assert state.adapter == ""
        assert state.tenant == tenant or (state.public and prompt.startswith(state.prefix))
    elif choice.build is not None:
        assert any(v.public == choice.build and prompt.startswith(v.prefix) for v in saved)
    elif not choice.erase:
        assert slots[choice.slot_id].tenant in (None, tenant)

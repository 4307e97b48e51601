"""Which llama-server slots and saved states a flush scope covers (pure)."""

from __future__ import annotations

from adapters.base import FlushScope
from adapters.llama_server.flush_scope import held_in_scope, saved_in_scope
from adapters.llama_server.slots import SavedView


def _saved(tenant: str, tag: str | None = None, public: str = "") -> SavedView:
    return SavedView("k", tenant, tag, "prefix", 0.0, public=public)


def test_held_in_scope_all_and_model_cover_every_slot() -> None:
    """`all` and `model` cover a slot whatever it last held, empty ones included."""
    for scope in (FlushScope("all"), FlushScope("model", model_id="m")):
        assert held_in_scope(None, None, scope)
        assert held_in_scope("a", "t", scope)


def test_held_in_scope_tenant_covers_only_that_tenant() -> None:
    """`tenant` covers the slots the tenant last held, never an empty one."""
    scope = FlushScope("tenant", tenant_id="a")
    assert held_in_scope("a", None, scope)
    assert not held_in_scope("b", None, scope)
    assert not held_in_scope(None, None, scope)


def test_held_in_scope_tag_with_tenant_needs_both() -> None:
    """`tag` covers the slots with the tag, and of the named tenant when one is given."""
    assert held_in_scope("a", "t", FlushScope("tag", tag="t"))
    assert held_in_scope("b", "t", FlushScope("tag", tag="t"))
    assert not held_in_scope("b", "t", FlushScope("tag", tenant_id="a", tag="t"))
    assert not held_in_scope("a", None, FlushScope("tag", tenant_id="a", tag="t"))


def test_saved_in_scope_public_prefix_only_for_all_and_model() -> None:
    """A public prefix's saved state belongs to no tenant: only `all`/`model` remove it."""
    public = _saved("", public="system")
    assert saved_in_scope(public, FlushScope("all"))
    assert saved_in_scope(public, FlushScope("model", model_id="m"))
    assert not saved_in_scope(public, FlushScope("tenant", tenant_id=""))
    assert not saved_in_scope(public, FlushScope("tag", tag=None))


def test_saved_in_scope_tenant_state_follows_its_tenant_and_tag() -> None:
    """A tenant's saved state goes with a flush of its tenant or its tag."""
    own = _saved("a", tag="t")
    assert saved_in_scope(own, FlushScope("tenant", tenant_id="a"))
    assert saved_in_scope(own, FlushScope("tag", tenant_id="a", tag="t"))
    assert not saved_in_scope(own, FlushScope("tenant", tenant_id="b"))

"""Which slots and saved states a flush removes (pure): the seed's flush `scope` read
against what a llama-server slot or saved state last held.

`all` / `model` cover everything of the engine's model; `tenant` what the tenant last
held; `tag` what carried the tag (and the tenant, when one is given). A public prefix's
saved state belongs to no tenant: only `all` / `model` remove it.
"""

from __future__ import annotations

from adapters.base import FlushScope
from adapters.llama_server.slots import SavedView


def held_in_scope(tenant: str | None, tag: str | None, scope: FlushScope) -> bool:
    """A slot (or a tenant's saved state) that last held `tenant` and `tag`, in `scope`."""
    if scope.scope in ("all", "model"):
        return True
    if scope.scope == "tenant":
        return tenant is not None and tenant == scope.tenant_id
    if scope.scope == "tag":
        if scope.tenant_id is not None and tenant != scope.tenant_id:
            return False
        return tag is not None and tag == scope.tag
    return False


def saved_in_scope(view: SavedView, scope: FlushScope) -> bool:
    """A saved state a flush removes: everything for `all`/`model`; a tenant's or tag's
    own states otherwise (a public prefix belongs to no tenant)."""
    if scope.scope in ("all", "model"):
        return True
    if view.public:
        return False
    return held_in_scope(view.tenant, view.tag, scope)

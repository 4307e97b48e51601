"""Which model ids a tenant may name, and what a request naming an adapter meets.

An adapter is a model id like any other (`<base>:<name>`), bound to the tenants its
declaration or its governed load lists (`LoraAdapter.tenants`). A request naming it:

    1. a tenant it is not bound to                        -> 403 model_not_allowed
    2. the adapter failed (its file is missing or changed) -> 503 model_unavailable
    3. being unloaded (governed adapter-unload)            -> 503 model_unloading
    4. being loaded, or not in its base's running engine   -> 503 model_unloading
       (retry shortly) when the base runs; else what the base's state gives (404
       model_not_loaded, ...), checked by the front-end as for the base itself
    5. otherwise: served by its base model's engine and slots, with the adapter chosen
       by the runner (the client's `lora` is removed by the engine's `rewrite`).

Step 1 is the adapter's own binding; the tenant's `models` entitlement (the tenants
file, docs/tenants.md) is then checked by the front-end on the adapter's id, exactly as on
any model id (`FrontEnd.check_model(..., named=adapter id)`): a request needs both. A
tenant entitled to an adapter's id needs no entitlement to its base model (the adapter is
what it asked for; the base is how it is served).
"""

from __future__ import annotations

from runner.engines.adapters import AdapterBook, AdapterRecord, AdapterState
from runner.scheduler.errors import ModelFailed, ModelUnloading
from tenants.errors import ModelNotAllowed
from tenants.policy import Entitlements

RETRY_S = 1


def check_bound(adapters: AdapterBook, tenant: str, models: Entitlements, model_id: str) -> None:
    """Step 1: an adapter names only tenants bound to it (`models`: the tenant's own
    entitlement, named in the refusal as every `model_not_allowed` does)."""
    record = adapters.get(model_id)
    if record is not None and not record.adapter.allows(tenant):
        allowed = ", ".join(models.patterns) if models.patterns is not None else "every model"
        raise ModelNotAllowed(tenant=tenant, model=model_id, allowed=allowed)


def check_adapter(record: AdapterRecord, loaded: bool) -> None:
    """Steps 2-4 for an adapter its tenant may use; `loaded`: its base's running engine
    has it now."""
    model = record.adapter.id
    if record.state is AdapterState.FAILED:  # 2
        raise ModelFailed(model=model, reason=record.error or "it failed", retry_after=30)
    if record.state is AdapterState.REMOVING:  # 3
        raise ModelUnloading(model=model, reason="it is being unloaded", retry_after=RETRY_S)
    if record.state is AdapterState.ADDING or not loaded:  # 4
        raise ModelUnloading(
            model=model, reason="it is being loaded into its engine", retry_after=RETRY_S
        )

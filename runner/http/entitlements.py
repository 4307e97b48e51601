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

SEAM (issue 26, tenant policy): the tenants file's `models` entitlement (ids and glob
patterns per tenant, 403 `model_not_allowed`) is being built beside this. Once it is
merged, `check_entitled` also asks that policy for every model id, adapters included, so
an adapter is refused unless both its binding and the tenant's policy allow it. Until
then only step 1's binding gates adapters, and base models are open to every tenant as
they always were.
"""

from __future__ import annotations

from runner.engines.adapters import AdapterBook, AdapterRecord, AdapterState
from runner.errors import ModelNotAllowed
from runner.scheduler.errors import ModelFailed, ModelUnloading

RETRY_S = 1


def check_entitled(adapters: AdapterBook, tenant: str, model_id: str) -> None:
    """Step 1 (and, after issue 26, the tenant's `models` policy: see SEAM above)."""
    record = adapters.get(model_id)
    if record is not None and not record.adapter.allows(tenant):
        raise ModelNotAllowed(tenant=tenant, model=model_id)


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

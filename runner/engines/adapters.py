"""The runner's LoRA adapters: which adapter ids exist, on which base model, who may use
them, and how busy each is.

An adapter is declared in the models file (`adapters:` of its base) or loaded by a
governed `adapter-load` (runner/lifecycle/adapter_ops.py). It is served by its base
model's engine; whether it is loaded right now is that engine's fact (the adapters the
engine was started with or added since, `AdapterHost.adapter_ids`), never kept twice here.
The book keeps what the engines cannot: the declaration, the tenants bound to it, the
files' rank, size and digest as read, the governed ones' state while they are being added
or removed, and each adapter's requests running and waiting (capabilities, and the
endpoint picker's `vllm:lora_requests_info`).

An adapter is a model id like any other (`<base>:<name>`), bound to the tenants its
declaration or its governed load lists (`LoraAdapter.tenants`). A request naming it
(the chat path asks `bound_adapter`, then `check_adapter`):

    1. a tenant it is not bound to: as if no adapter had that id (what the front-end
       answers any unknown model: 403 model_not_allowed outside the tenant's `models`,
       else 404), so nobody learns of adapters bound to others
    2. the adapter failed (its file is missing or changed) -> 503 model_unavailable
    3. being unloaded (governed adapter-unload)            -> 503 model_unloading
    4. being loaded, or not in its base's running engine   -> 503 model_unloading
       (retry shortly) when the base runs; else what the base's state gives (404
       model_not_loaded, ...), checked by the front-end as for the base itself
    5. otherwise: served by its base model's engine and slots, with the adapter chosen
       by the runner (the client's `lora` is removed by the engine's `rewrite`).

Step 1 is the adapter's own binding; the tenant's `models` entitlement (the tenants
file, docs/tenants.md) is then checked by the path's gate on the adapter's id, exactly as on
any model id (`PathGate.check_model(..., named=adapter id)`): a request needs both. A
tenant entitled to an adapter's id needs no entitlement to its base model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from adapters.base import AdapterHost
from adapters.lora import LoraAdapter, file_digest, read_rank, size_mb
from runner.floor.models_file import ModelSpec
from runner.scheduler.errors import ModelFailed, ModelUnloading

log = logging.getLogger("quorum.adapters")


class AdapterState(StrEnum):
    """Where an adapter stands in the book (its engine says whether it is loaded)."""

    ACTIVE = "active"  # part of its base's adapter set: loaded whenever the base is
    ADDING = "adding"  # a governed load is putting it into the running engine
    REMOVING = "removing"  # a governed unload: refused to new requests, draining
    FAILED = "failed"  # its file is missing or does not match its digest


@dataclass
class AdapterRecord:
    adapter: LoraAdapter
    state: AdapterState = AdapterState.ACTIVE
    error: str | None = None
    running: int = 0  # requests on an engine now
    waiting: int = 0  # requests in the runner's queue for it
    loaded_at: int | None = None  # unix time a governed load put it in the running engine
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # no request of it left

    def __post_init__(self) -> None:
        self.idle.set()

    def queued(self) -> None:
        """A request for it waits in the runner's queue."""
        self.waiting += 1
        self.idle.clear()

    def started(self) -> None:
        """Its request was granted a slot."""
        self.waiting -= 1
        self.running += 1

    def ended(self, started: bool) -> None:
        """Its request left (answered, refused or withdrawn)."""
        if started:
            self.running -= 1
        else:
            self.waiting -= 1
        if self.running + self.waiting <= 0:
            self.idle.set()


class AdapterBook:
    """Every adapter of the runner, by the model id clients send. `hosts`: the ready
    engines that serve adapters, by model (the pool's `ReadyEngines.adapters`): whether an
    adapter is loaded is theirs to say (`loaded`)."""

    def __init__(self, models: Iterable[ModelSpec], hosts: Mapping[str, AdapterHost]) -> None:
        self.hosts = hosts
        self._records: dict[str, AdapterRecord] = {}
        for spec in models:
            for declared in spec.adapters:
                adapter = LoraAdapter(
                    id=declared.model_id(spec.id),
                    name=declared.name,
                    base=spec.id,
                    path=str(Path(declared.path).expanduser()),
                    tenants=tuple(declared.tenants),
                    sha256=declared.sha256,
                    scale=declared.scale,
                )
                self._records[adapter.id] = AdapterRecord(adapter)

    def get(self, model_id: str) -> AdapterRecord | None:
        return self._records.get(model_id)

    def __iter__(self) -> Iterator[AdapterRecord]:
        return iter(list(self._records.values()))

    def __contains__(self, model_id: object) -> bool:
        return model_id in self._records

    def loaded(self, record: AdapterRecord) -> bool:
        """Its base's running engine has it loaded now."""
        host = self.hosts.get(record.adapter.base)
        return host is not None and record.adapter.id in host.adapter_ids

    def count(self, base: str) -> int:
        """Adapters on `base` in any state but failed (against its `max_adapters`)."""
        return sum(
            1
            for r in self._records.values()
            if r.adapter.base == base and r.state is not AdapterState.FAILED
        )

    def add(self, adapter: LoraAdapter, state: AdapterState) -> AdapterRecord:
        record = self._records[adapter.id] = AdapterRecord(adapter, state)
        return record

    def remove(self, model_id: str) -> None:
        self._records.pop(model_id, None)

    def check_files(self, base: str) -> list[LoraAdapter]:
        """Read each active adapter of `base` from disk before its engine starts (blocking:
        call it in a thread): rank, size and digest filled in; one whose file is missing
        or whose digest differs from the declared `sha256` is FAILED (its engine starts
        without it; capabilities say why). The adapters to start with."""
        ready: list[LoraAdapter] = []
        for record in self._records.values():
            adapter = record.adapter
            if adapter.base != base or record.state not in (
                AdapterState.ACTIVE,
                AdapterState.FAILED,
            ):
                continue
            path = Path(adapter.path)
            try:
                digest = file_digest(path)
            except OSError as exc:
                self._fail(record, f"its file cannot be read ({exc.strerror})")
                continue
            if adapter.sha256 is not None and digest != adapter.sha256:
                self._fail(record, "its file's sha256 differs from the one declared")
                continue
            record.adapter = replace(
                adapter, sha256=digest, rank=read_rank(path), size_mb=size_mb(path)
            )
            record.state, record.error = AdapterState.ACTIVE, None
            ready.append(record.adapter)
        return ready

    def _fail(self, record: AdapterRecord, why: str) -> None:
        record.state, record.error = AdapterState.FAILED, why
        log.error("adapter %s: %s; its base starts without it", record.adapter.id, why)


class Counted:
    """`with Counted(record) as count:` counts the request against its adapter while it
    waits and runs (nothing for a base model's request); `count.running()` once it runs.
    A class, not a generator context manager: every chat request enters one, adapter or
    not (three contextlib calls each)."""

    __slots__ = ("record", "started")

    def __init__(self, record: AdapterRecord | None) -> None:
        self.record = record
        self.started = False

    def __enter__(self) -> Counted:
        if self.record is not None:
            self.record.queued()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.record is not None:
            self.record.ended(self.started)

    def running(self) -> None:
        if self.record is not None and not self.started:
            self.started = True
            self.record.started()


RETRY_S = 1  # an adapter being loaded: ask again this soon


def bound_adapter(adapters: AdapterBook, tenant: str, model_id: str) -> AdapterRecord | None:
    """Step 1: the adapter `model_id` names, for a tenant bound to it; None for anyone
    else, as for an id no adapter has."""
    record = adapters.get(model_id)
    if record is None or not record.adapter.allows(tenant):
        return None
    return record


def listed_to(record: AdapterRecord, asker: str | None, admins: frozenset[str]) -> bool:
    """Whether capabilities and `/v1/models` list `record` to `asker`: its bound tenants
    and admins; a caller naming nobody sees only adapters bound to every tenant (`*`)."""
    if asker is None:
        return "*" in record.adapter.tenants
    return asker in admins or record.adapter.allows(asker)


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

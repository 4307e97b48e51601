"""What the status page shows (pure): the runner's state as one JSON document.

`runner/http/status_page.py` gathers the inputs from the Runtime and serves the page; this
module only shapes them. What it leaves out on purpose: tokens, nonces and key material
(an audit record names who signed, by principal and a short key id), prompts and
request bodies (queues are counts per tenant and priority), engine log lines (a failed
model shows its reason's first line, as capabilities do).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PRIORITIES = ("high", "normal", "low")
MAX_AUDIT = 20
MAX_TEXT = 160
KEY_ID_CHARS = 12


@dataclass(frozen=True, slots=True)
class ModelRow:
    id: str
    backend: str
    state: str
    mem_mb: int
    weights_mb: int | None
    kv_mb: int | None
    kv_utilization: float | None
    restarts: int
    exit_code: int | None
    error: str | None
    loaded_at: int | None


@dataclass(frozen=True, slots=True)
class LoadRow:
    task_id: str
    model_id: str
    status: str
    progress: float
    eta: float | None
    created_at: float


@dataclass(frozen=True, slots=True)
class Waiting:
    """One waiting request, as counted: never its body."""

    tenant: str
    priority: str
    model: str


@dataclass(frozen=True, slots=True)
class BudgetRow:
    """One token budget of a tenant and its current window's counter (None: the store
    did not answer)."""

    text: str  # `2000 tokens per minute`, as refusals name it
    tokens: int
    per: str
    count: str
    model: str | None
    used: int | None
    resets_at: int  # the window's end, Unix seconds


@dataclass(frozen=True, slots=True)
class TenantRow:
    """A tenant as the page shows it: its policy's limits and where it stands."""

    tenant: str
    priority: tuple[str, str]  # (default, max)
    models: tuple[str, ...] | None  # None: every model
    in_flight: int  # at this replica's engines
    in_flight_all: int | None  # across the replicas sharing the cap (None: not shared)
    max_in_flight: int | None
    budgets: Sequence[BudgetRow] = ()


@dataclass(frozen=True, slots=True)
class PageInputs:
    runner_id: str
    life: str
    uptime_s: float
    memory_total_mb: int
    memory_used_mb: int
    memory_free_mb: int
    memory_source: str
    models: Sequence[ModelRow]
    loads: Sequence[LoadRow]
    queue_depth: int
    queue_max_depth: int
    avg_wait_ms: int
    p95_wait_ms: int
    in_flight: Mapping[str, int]
    waiting: Sequence[Waiting]
    audit: Sequence[Mapping[str, Any]]
    audit_source: str
    tenants: Sequence[TenantRow] = ()
    now: float = field(default_factory=time.time)


def page_state(inputs: PageInputs) -> dict[str, object]:
    """The document `GET /ui/state.json` answers and the page renders.

    1. The runner: id, life, uptime, memory (used, free, total, where it is measured).
    2. Models in name order, each with its state, memory (weights and KV when measured),
       restarts and, when failed, exit code and the first line of the reason.
    3. Loads in progress, oldest first.
    4. Queues: waiting requests per tenant and priority, per priority, in flight per model.
    5. Governance: the last MAX_AUDIT decisions, newest first (see `audit_row`).
    6. Tenants in name order: priority, models, in flight against the cap, queued, and
       each token budget with what its window has used and what remains.
    """
    return {
        "runner": {  # 1
            "id": inputs.runner_id,
            "life": inputs.life,
            "uptimeS": round(inputs.uptime_s),
            "memory": {
                "totalMB": inputs.memory_total_mb,
                "usedMB": inputs.memory_used_mb,
                "freeMB": inputs.memory_free_mb,
                "source": inputs.memory_source,
            },
        },
        "models": [_model(m) for m in sorted(inputs.models, key=lambda m: m.id)],  # 2
        "loads": [  # 3
            {
                "taskId": load.task_id,
                "modelId": load.model_id,
                "status": load.status,
                "progress": round(load.progress, 4),
                "eta": load.eta,
                "ageS": round(max(0.0, inputs.now - load.created_at), 1),
            }
            for load in sorted(inputs.loads, key=lambda t: t.created_at)
        ],
        "queues": _queues(inputs),  # 4
        "audit": {  # 5
            "source": inputs.audit_source,
            "decisions": [audit_row(r) for r in list(inputs.audit)[-MAX_AUDIT:]][::-1],
        },
        "tenants": [_tenant(t, inputs) for t in sorted(inputs.tenants, key=lambda t: t.tenant)],
        "generatedAt": inputs.now,
    }


def _tenant(t: TenantRow, inputs: PageInputs) -> dict[str, object]:
    queued = sum(1 for w in inputs.waiting if w.tenant == t.tenant)
    return {
        "tenant": t.tenant,
        "priority": {"default": t.priority[0], "max": t.priority[1]},
        "models": list(t.models) if t.models is not None else None,
        "inFlight": t.in_flight,
        "inFlightAllReplicas": t.in_flight_all,
        "maxInFlight": t.max_in_flight,
        "queued": queued,
        "budgets": [
            {
                "budget": b.text,
                "tokens": b.tokens,
                "per": b.per,
                "count": b.count,
                "model": b.model,
                "used": b.used,
                "remaining": None if b.used is None else max(0, b.tokens - b.used),
                "resetsInS": max(0, round(b.resets_at - inputs.now)),
            }
            for b in t.budgets
        ],
    }


def _model(m: ModelRow) -> dict[str, object]:
    return {
        "id": m.id,
        "backend": m.backend,
        "state": m.state,
        "memoryMB": m.mem_mb,
        "weightsMB": m.weights_mb,
        "kvMB": m.kv_mb,
        "kvUtilization": m.kv_utilization,
        "restarts": m.restarts,
        "exitCode": m.exit_code,
        "error": first_line(m.error),
        "loadedAt": m.loaded_at,
    }


def _queues(inputs: PageInputs) -> dict[str, object]:
    per_tenant: dict[str, Counter[str]] = {}
    for w in inputs.waiting:
        per_tenant.setdefault(w.tenant, Counter())[w.priority] += 1
    by_priority = Counter(w.priority for w in inputs.waiting)
    return {
        "depth": inputs.queue_depth,
        "maxDepth": inputs.queue_max_depth,
        "avgWaitMs": inputs.avg_wait_ms,
        "p95WaitMs": inputs.p95_wait_ms,
        "byPriority": {p: by_priority[p] for p in PRIORITIES},
        "byTenant": [
            {"tenant": tenant, **{p: counts[p] for p in PRIORITIES}}
            for tenant, counts in sorted(per_tenant.items())
        ],
        "inFlight": {m: n for m, n in sorted(inputs.in_flight.items()) if n},
    }


def audit_row(record: Mapping[str, Any]) -> dict[str, object]:
    """One governance decision: when, what (operation, model, the approved fields), the
    outcome, and who signed (principals and short key ids). Nonces are not shown, and no
    token is ever in a record (governance/audit.py)."""
    params = record.get("params")
    return {
        "time": record.get("time"),
        "operation": record.get("operation"),
        "modelId": record.get("model_id"),
        "params": {
            str(k): _short(v) for k, v in (params.items() if isinstance(params, Mapping) else ())
        },
        "outcome": record.get("outcome"),
        "reason": record.get("reason"),
        "status": record.get("status"),
        "principals": list(_strings(record.get("principals"))),
        "keyIds": [k[:KEY_ID_CHARS] for k in _strings(record.get("key_ids"))],
    }


def first_line(text: str | None) -> str | None:
    """The first line of `text`, at most MAX_TEXT characters."""
    if not text:
        return None
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= MAX_TEXT else line[: MAX_TEXT - 1] + "…"


def _short(value: object) -> object:
    if isinstance(value, bool | int | float) or value is None:
        return value
    text = str(value)
    return text if len(text) <= 64 else text[:63] + "…"


def _strings(value: object) -> Iterable[str]:
    if isinstance(value, list | tuple):
        return (str(v) for v in value)
    return ()

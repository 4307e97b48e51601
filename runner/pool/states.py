"""A model's state in the pool (pure), and what each state answers over HTTP.

    UNLOADED ──load──▶ LOADING ──ready──▶ READY ──unload──▶ DRAINING ──▶ STOPPING ──▶ UNLOADED
        ▲                │  ▲               │                   │              │
        │                │  └─restart──┐    └──engine died──▶ FAILED ◀─────────┘(stop failed)
        │                └──failed / cancelled──▶ FAILED ──load──▶ LOADING
        └──────────────────────────── unload ◀──────────┘   │
                                 unload mode "sleep" (vLLM) ▼
                  LOADING ◀──load (wake up)── SLEEPING ──unload──▶ STOPPING

| state     | inference request for it                        | capabilities     |
|-----------|-------------------------------------------------|------------------|
| UNLOADED  | 404 model_not_loaded (autoload: waits, loads)   | available        |
| LOADING   | waits in the queue (its timeout applies)        | loading          |
| READY     | served (200, or the engine's answer)            | loaded           |
| DRAINING  | 503 model_unloading; in-flight ones finish      | loaded           |
| STOPPING  | 503 model_unloading                             | (none)           |
| FAILED    | 503 model_failed with the reason (exit code)    | failed + reason  |
| SLEEPING  | 404 model_not_loaded (a load wakes it up)       | available        |

Only the pool moves a model's state, through `transition`; everyone else reads it.
"""

from __future__ import annotations

import enum


class ModelState(enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    FAILED = "failed"
    SLEEPING = "sleeping"  # vLLM's warm standby: the process lives, weights off the GPU


ALLOWED: dict[ModelState, frozenset[ModelState]] = {
    ModelState.UNLOADED: frozenset({ModelState.LOADING}),
    ModelState.LOADING: frozenset({ModelState.READY, ModelState.FAILED, ModelState.STOPPING}),
    ModelState.READY: frozenset({ModelState.DRAINING, ModelState.FAILED, ModelState.STOPPING}),
    ModelState.DRAINING: frozenset({ModelState.STOPPING, ModelState.FAILED, ModelState.SLEEPING}),
    ModelState.STOPPING: frozenset({ModelState.UNLOADED, ModelState.FAILED}),
    ModelState.FAILED: frozenset({ModelState.LOADING, ModelState.STOPPING, ModelState.UNLOADED}),
    ModelState.SLEEPING: frozenset({ModelState.LOADING, ModelState.STOPPING, ModelState.FAILED}),
}


class IllegalModelTransition(RuntimeError):
    """A state change the table forbids (always a bug)."""


def transition(model: str, current: ModelState, to: ModelState) -> ModelState:
    if to not in ALLOWED[current]:
        raise IllegalModelTransition(f"model {model!r}: {current.value} -> {to.value}")
    return to

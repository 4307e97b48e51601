"""The `/v1/capabilities` document (pure): what this runner can do and how full it is.

The central router polls it every 5 s. Memory figures come from NVML on a GPU
(`memorySource: "nvml"`, `gpuIds` the devices); without one from the configured budget
(`memorySource: "budget"`, `gpuIds` empty: there is no GPU to name). Nothing is invented:
what the runner cannot know reads zero or null.

From the engines (`runner/engines/watch.py`, polled off the hot path): `runnerType` names
the engine kinds this runner serves and their versions (`vllm-0.32.0`, the seed's form); the
`capabilities` flags are those of the loaded engines (each kind's `features`,
`adapters/kind.py`; nothing loaded claims nothing); the KV figures of engines that report
their own (vLLM's KV pool and `kv_cache_usage_perc`, ComfyUI: none) replace the snapshot's
estimate for them; the queue adds what the engines report of themselves: `queue.depth`
counts requests waiting in the runner and inside the engines (vLLM's `num_requests_waiting`,
ComfyUI's pending prompts). `queue.running` (an addition to the seed's keys) is the
scheduler's: the requests holding an engine slot now, the same count that decides who is
granted next (a ComfyUI prompt included, and a request whose client left until its engine
let it go; a poll of the engines would lag it by up to ENGINE_STATS_INTERVAL_S), less those
the engines say they hold queued (counted in `depth` already). `queue.forecastWaitMs` and
`queue.forecastWaitMsByModel` are the scheduler's forecasts (`runner/scheduler/forecast.py`).

LoRA adapters (`adapters`, each as `runner/lifecycle/adapter_ops.adapter_entry` lists it:
base, rank, memory, state, requests running and waiting) are models a router may send
requests for: a loaded one is listed in `models.loaded` (with its `baseModel`), every one
in `models.available`, and all of them with their figures in `adapters` (a key present
only on a runner with adapters).

On a runner with governance, `{"governance": {"audit": ...}}` (an addition) publishes
the audit key's public half (`algorithm`, `keyId`, `publicKey`) and the latest signed
`head` of its audit log (docs/governance.md, "A log nobody can rewrite unseen").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from adapters.features import Features, combined
from adapters.launched import EngineLoad
from runner import __version__
from runner.engines.record import EngineRecord
from runner.floor.models_file import ModelSpec
from runner.scheduler.models import ModelState, ModelView
from runner.tasks import LoadTask
from runner.telemetry.snapshot import ResourceSnapshot


def runner_type(backends: Iterable[str], versions: Mapping[str, str]) -> str:
    """`<engine>-<version>` of each engine kind the runner serves, sorted, joined with `+`
    (a kind whose version is not known yet: its name alone); no models: `quorum-<version>`."""
    kinds = [f"{b}-{versions[b]}" if b in versions else b for b in sorted(set(backends))]
    return "+".join(kinds) or f"quorum-{__version__}"


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def kv_utilization(loads: Sequence[EngineLoad]) -> float:
    """The engines' KV cache use, weighted by their cache sizes when known (0..1)."""
    sized = [load for load in loads if load.kv_cache_mb > 0]
    if sized:
        total = sum(load.kv_cache_mb for load in sized)
        return round(sum(load.kv_cache_utilization * load.kv_cache_mb for load in sized) / total, 4)
    used = [load.kv_cache_utilization for load in loads]
    return round(sum(used) / len(used), 4) if used else 0.0


def capabilities(
    runner_id: str,
    health: str,
    models: Mapping[str, ModelView],
    specs: Mapping[str, ModelSpec],
    engines_of: Mapping[str, EngineRecord],
    queue: Mapping[str, object],
    multi_tenant: bool,
    features_of: Callable[[ModelSpec], Features],
    *,
    loading: Mapping[str, LoadTask] | None = None,
    available: Sequence[str] = (),
    resources: ResourceSnapshot | None = None,
    engines: Mapping[str, EngineLoad] | None = None,
    versions: Mapping[str, str] | None = None,
    adapters: Sequence[Mapping[str, object]] = (),
    audit: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """The document (pure): models from the scheduler's view of them (`models`: the one
    state) and the catalog (`specs`), the engine facts of those with an engine from the
    pool (`engines_of`: the spec and load parameters it was started from, when it became
    ready) and the load tasks' progress; resources from the latest snapshot
    (`runner/telemetry/snapshot.py`, refreshed off the hot path) and the engines' own
    figures (`engines`, by model); `health` as `/health` says it
    (`runner/telemetry/health.py`); `features_of` what a loaded engine of a spec offers
    (its kind's); `versions` the engine versions by backend; `audit` the audit key's
    public half and the latest signed head (a runner with governance)."""
    loading = loading or {}
    res = resources or ResourceSnapshot()
    known = [m for m in models.values() if m.model in specs]
    loaded = [(m, engines_of[m.model]) for m in known if m.serving and m.model in engines_of]
    engines = engines or {}
    loads = [engines[m.model] for m, _ in loaded if m.model in engines]
    inside = sum(load.waiting for load in loads)  # granted, but queued inside an engine
    caches = loads + [  # engines that report no KV figures of their own: the snapshot's
        EngineLoad(m.kv_mb, m.kv_utilization) for m in res.models if m.model not in engines
    ]
    features = combined(features_of(e.spec) for _, e in loaded).to_json()
    bases = {m.model: e for m, e in loaded}
    doc: dict[str, object] = {
        "runnerType": runner_type((s.backend for s in specs.values()), versions or {}),
        "runnerId": runner_id,
        "models": {
            "loaded": [
                {
                    "id": m.model,
                    "quantization": e.params.quantization or e.spec.quantization,
                    "contextLength": e.params.max_context_length or e.spec.context_length,
                    "loadedAt": e.loaded_at,
                    "gpuMemoryMB": m.mem_mb,
                }
                for m, e in loaded
            ]
            + [
                {
                    "id": a["id"],
                    "baseModel": base,
                    "quantization": e.params.quantization or e.spec.quantization,
                    "contextLength": e.params.max_context_length or e.spec.context_length,
                    "loadedAt": e.loaded_at,
                    "gpuMemoryMB": a["memoryMB"],
                }
                for a in adapters
                if a["state"] == "loaded" and (e := bases.get(base := str(a["baseModel"])))
            ],
            "loading": [
                {
                    "id": m.model,
                    "progress": loading[m.model].progress if m.model in loading else 0.0,
                    "eta": loading[m.model].eta if m.model in loading else None,
                }
                for m in known
                if m.state is ModelState.LOADING
            ],
            "available": (list(available) or sorted(specs)) + [str(a["id"]) for a in adapters],
            "failed": [
                {"id": m.model, "error": m.reason, "exitCode": m.exit_code}
                for m in known
                if m.state is ModelState.FAILED
            ],
        },
        "resources": {
            "gpuIds": [g.index for g in res.gpus if res.source == "nvml"],
            "gpuMemoryTotalMB": res.total_mb,
            "gpuMemoryUsedMB": res.used_mb,
            "gpuMemoryFreeMB": res.free_mb,
            "gpuUtilization": res.utilization,
            "kvCacheSizeMB": round(sum(kv.kv_cache_mb for kv in caches)),
            "kvCacheUtilization": kv_utilization(caches),
            "memorySource": res.source,
        },
        "queue": {
            **queue,
            "depth": _int(queue.get("depth")) + inside,
            "running": max(0, _int(queue.get("running")) - inside),
        },
        "capabilities": {
            "streaming": features["streaming"],
            "prefixCaching": features["prefixCaching"],
            "multiTenant": multi_tenant,
            "visionInput": features["visionInput"],
            "audioInput": features["audioInput"],
            "functionCalling": features["functionCalling"],
        },
        "health": health,
    }
    if adapters:  # an addition, only on a runner with adapters
        doc["adapters"] = list(adapters)
    if audit is not None:  # an addition: what `quorum audit verify` checks a log against
        doc["governance"] = {"audit": dict(audit)}
    return doc

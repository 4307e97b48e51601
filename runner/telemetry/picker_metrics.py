"""The endpoint picker's view of the runner: vLLM's metric names, whatever engine serves.

Kubernetes' Gateway API Inference Extension routes across model-server pods with an
endpoint picker (llm-d's router) that scrapes each pod's metrics path (`/metrics/picker`
here, PICKER_METRICS_PATH; the picker's `metrics-data-source` `path` in
deploy/k8s/base/epp-config.yaml) and, with no engine label on the pod, reads vLLM's names.
It reads typed samples only, and of a family it takes the last sample, so each name below
is one unlabelled sample of the runner's own, typed `gauge`:

- `vllm:num_requests_waiting`: requests waiting in the runner's queue (every tenant's
  queue, every model; the scheduler's waiting room);
- `vllm:num_requests_running`: requests the scheduler granted that an engine is serving
  now (a request queued inside the engine, vLLM's own `waiting`, counts here: the runner
  handed it over);
- `vllm:kv_cache_usage_perc` (0..1): KV cache in use over every engine that has one
  (vLLM: its own gauge at the engine watch's last poll; llama-server: its slots' cached
  tokens at the last 5 s snapshot), weighted by each cache's size; 0 when none has one;
- `vllm:cache_config_info{block_size,num_gpu_blocks}` (value 1): vLLM engines' paged KV
  cache, blocks summed over engines that share one block size; absent where no engine
  says (llama-server, whisper and ComfyUI have no paged blocks);
- `vllm:lora_requests_info{max_lora,running_lora_adapters,waiting_lora_adapters}`
  (value: the scrape's Unix time, the picker takes the newest): the runner's LoRA
  adapters, comma-separated, as the Gateway API Inference Extension's model server
  protocol names them (its proposal 003, "model server protocol"; its extractor reads the
  three labels of the newest sample into `ActiveModels`, `WaitingModels` and
  `MaxActiveModels`, and the LoRA-affinity scorer prefers a pod whose active or waiting set
  holds the request's `model`): `running` the adapters loaded in a running engine, ready
  to serve; `waiting` the adapters with requests waiting in the runner's queue or a
  governed load under way; `max_lora` how many adapters the runner holds (it loads none on
  demand, so a pod without the adapter reads full). Base models are not listed: an
  adapter is a model id of its own, and a pool routes one base model.

When an engine is vLLM its own series of these names are shadowed
(`EngineFamiliesCollector.shadow`): the runner's aggregate replaces them, never two values
for one name; vLLM's other series are served beside them, on the same path (the
`vllm:*` names stay off `/metrics`: promtool flags a `:`, runner/telemetry/metrics.py). Everything
is read at scrape time from what the runner already keeps in memory (the scheduler's
counts, the last snapshot, the engine watch's last poll): no engine call and nothing
sorted, O(models) per scrape.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from adapters.engine_families import EngineFamiliesCollector
from adapters.launched import EngineLoad
from runner.engines.adapters import AdapterBook, AdapterState
from runner.engines.specs import ModelSpecs
from runner.engines.watch import EngineWatch
from runner.floor.models_file import ModelSpec
from runner.scheduler import SchedulerAdmission
from runner.scheduler.models import ModelView
from runner.telemetry.snapshot import ResourceSnapshot

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
CACHE_CONFIG = "vllm:cache_config_info"
LORA_INFO = "vllm:lora_requests_info"
NAMES = (WAITING, RUNNING, KV_USAGE, CACHE_CONFIG, LORA_INFO)


@dataclass(frozen=True, slots=True)
class KvCache:
    """One engine's KV cache: the share in use (0..1) and its size (0: not known)."""

    usage: float
    size_mb: float = 0.0


@dataclass(frozen=True, slots=True)
class PickerView:
    """What the picker's gauges say, gathered once per scrape."""

    waiting: int
    running: int
    kv_usage: float
    cache_config: tuple[int, int] | None  # (block_size, num_gpu_blocks)
    running_adapters: tuple[str, ...]
    waiting_adapters: tuple[str, ...]
    max_adapters: int


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    """One adapter as the picker's LoRA family reports it."""

    adapter: str
    loaded: bool  # in its base model's running engine
    waiting: int  # its requests waiting in the runner's queue
    loading: bool  # a governed load is putting it into the engine


def kv_usage(caches: Iterable[KvCache]) -> float:
    """The share of the runner's KV cache in use.

    1. No engine with a KV cache: 0.
    2. Every cache's size known: the usages weighted by size.
    3. Otherwise the plain mean of the usages.
    4. Clamped to 0..1.
    """
    known = list(caches)
    if not known:  # 1
        return 0.0
    total = sum(c.size_mb for c in known)
    if all(c.size_mb > 0 for c in known):  # 2
        share = sum(c.usage * c.size_mb for c in known) / total
    else:  # 3
        share = sum(c.usage for c in known) / len(known)
    return min(max(share, 0.0), 1.0)  # 4


def cache_config(samples: Iterable[Sample]) -> tuple[int, int] | None:
    """`(block_size, num_gpu_blocks)` out of vLLM's `vllm:cache_config_info` samples.

    1. Samples whose `block_size` and `num_gpu_blocks` are not whole numbers (vLLM writes
       "None" before it has profiled memory) are left out.
    2. None left, or engines with different block sizes (no one figure is true): None.
    3. Otherwise the one block size and the blocks summed over engines.
    """
    sizes: set[int] = set()
    blocks = 0
    for s in samples:
        try:  # 1
            size, count = int(s.labels["block_size"]), int(s.labels["num_gpu_blocks"])
        except (KeyError, ValueError):
            continue
        sizes.add(size)
        blocks += count
    if len(sizes) != 1:  # 2
        return None
    return sizes.pop(), blocks  # 3


def picker_view(
    models: Mapping[str, ModelView],
    queue_depth: int,
    specs: Mapping[str, ModelSpec],
    snapshot: ResourceSnapshot,
    loads: Mapping[str, EngineLoad],
    cache_samples: Iterable[Sample],
    reports_kv: Callable[[ModelSpec], bool] = lambda _spec: False,
    adapters: Iterable[AdapterInfo] = (),
) -> PickerView:
    """The picker's figures from the scheduler's models and queue, the models' specs, the
    last snapshot, the engine watch's last poll, vLLM's `cache_config_info` samples and
    the runner's adapters; `reports_kv(spec)`: whether its kind's engines report their KV
    figures themselves.

    1. Waiting: the scheduler's queue; running: its requests in flight, over all models.
    2. KV caches: from the engine's own figures for a model whose engines report them
       (vLLM), else from the snapshot for a model whose memory holds a KV cache
       (llama-server); other models have none.
    3. Adapters loaded are running; adapters with requests waiting, or being loaded, are
       waiting; `max_adapters` counts the adapters loaded or being loaded.
    """
    kv: list[KvCache] = []  # 2
    measured = {m.model: m for m in snapshot.models}
    for model, spec in specs.items():
        if reports_kv(spec):
            if (load := loads.get(model)) is not None:
                kv.append(KvCache(load.kv_cache_utilization, load.kv_cache_mb))
        elif (memory := measured.get(model)) is not None and memory.kv_cache:
            kv.append(KvCache(memory.kv_utilization, memory.kv_mb))
    held = list(adapters)  # 3
    ready = tuple(sorted(a.adapter for a in held if a.loaded))
    waiting = tuple(sorted(a.adapter for a in held if a.waiting > 0 or a.loading))
    return PickerView(
        waiting=queue_depth,  # 1
        running=sum(v.in_flight for v in models.values()),
        kv_usage=kv_usage(kv),
        cache_config=cache_config(cache_samples),
        running_adapters=ready,
        waiting_adapters=waiting,
        max_adapters=sum(1 for a in held if a.loaded or a.loading),
    )


def families(view: PickerView, now: float) -> list[Metric]:
    """The five families of `view`, each one unlabelled (or info-labelled) gauge sample."""
    waiting = GaugeMetricFamily(WAITING, "Requests waiting in the runner's queue, all tenants")
    waiting.add_metric([], view.waiting)
    running = GaugeMetricFamily(RUNNING, "Requests being served by an engine")
    running.add_metric([], view.running)
    usage = GaugeMetricFamily(KV_USAGE, "KV-cache usage over the runner's engines, 0..1")
    usage.add_metric([], view.kv_usage)
    config = GaugeMetricFamily(
        CACHE_CONFIG, "The engines' paged KV cache", labels=["block_size", "num_gpu_blocks"]
    )
    if view.cache_config is not None:
        config.add_metric([str(n) for n in view.cache_config], 1.0)
    lora = GaugeMetricFamily(
        LORA_INFO,
        "LoRA adapters loaded (running) and asked for (waiting); value: when this was read",
        labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
    )
    lora.add_metric(
        [
            str(view.max_adapters),
            ",".join(view.running_adapters),
            ",".join(view.waiting_adapters),
        ],
        now,
    )
    return [waiting, running, usage, config, lora]


class PickerCollector(Collector):
    """The picker's gauges, gathered from `read()` at each scrape."""

    def __init__(self, read: Callable[[], PickerView], clock: Callable[[], float] = time.time):
        self.read = read
        self.clock = clock

    def describe(self) -> Iterator[Metric]:
        """The families' names, so the registry checks them without gathering figures."""
        yield from families(PickerView(0, 0, 0.0, None, (), (), 0), 0.0)

    def collect(self) -> Iterator[Metric]:
        yield from families(self.read(), self.clock())


def adapter_infos(book: AdapterBook) -> list[AdapterInfo]:
    """The runner's adapters as the LoRA family reports them (O(adapters))."""
    return [
        AdapterInfo(r.adapter.id, book.loaded(r), r.waiting, r.state is AdapterState.ADDING)
        for r in book
    ]


def picker_collector(
    admission: SchedulerAdmission,
    specs: ModelSpecs,
    snapshot: Callable[[], ResourceSnapshot],
    watch: EngineWatch,
    vllm: EngineFamiliesCollector,
    book: AdapterBook,
) -> PickerCollector:
    """The runner's picker gauges, read from what it holds; vLLM's own series of the same
    names are shadowed from now on."""
    vllm.shadow(NAMES)

    def read() -> PickerView:
        return picker_view(
            admission.models(),
            admission.queue_depth(),
            specs.specs(),
            snapshot(),
            watch.loads,
            vllm.samples(CACHE_CONFIG),
            lambda spec: specs.kind(spec).traits.reports_kv,
            adapter_infos(book),
        )

    return PickerCollector(read)

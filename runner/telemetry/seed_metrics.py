"""The seed contract's metric names, derived from the runner's own at scrape time.

The seed's `GET /metrics` example names five series; a dashboard written from it finds
them here, typed and labelled as the seed shows them:

| seed name | type | labels | read from |
|---|---|---|---|
| `vllm_requests_total` | counter | model, tenant, status | `quorum_requests_total` |
| `vllm_cache_hit_rate` | gauge | model | `quorum_cache_hit_rate` |
| `vllm_queue_depth` | gauge | — | the scheduler's queue, all priorities |
| `vllm_gpu_memory_used` | gauge | gpu | bytes, the last snapshot's devices |
| `vllm_inference_duration_seconds` | histogram | model | `quorum_inference_duration_seconds` |

`status` is the HTTP status folded into a class (`status_class`): `success` (2xx, the
seed's example), `cancelled` (499), `client_error` (other 4xx), `server_error` (5xx).

Nothing is counted twice on the request path: each scrape derives them from the samples
the runner already keeps (O(series), as rendering them is); the histogram is not even
collected twice: the exposition writes it again under the seed's name
(runner/telemetry/exposition.py `twins`). `METRICS_NAMES` chooses what `/metrics`
carries: `both` (the default: the seed's names and the `quorum_*` ones, which the Grafana
dashboard reads), `seed` (the five `quorum_*` twins are left out) or `quorum` (the seed's
names are not served).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from runner.telemetry.metrics import Metrics
from runner.telemetry.snapshot import MIB, ResourceSnapshot

MetricsNames = Literal["seed", "quorum", "both"]

DURATION = "quorum_inference_duration_seconds"  # written twice, collected once (exposition)
# The `quorum_*` families (as prometheus_client names them) the seed's names stand for.
TWINS = frozenset(
    {
        "quorum_requests",
        "quorum_cache_hit_rate",
        "quorum_queue_depth",
        "quorum_gpu_memory_used_bytes",
        DURATION,
    }
)


def status_class(code: str) -> str:
    """The seed's `status` for an HTTP status code.

    1. 2xx: `success` (the seed's example).
    2. 499, the client went away before its answer: `cancelled`.
    3. Other 4xx: `client_error`; 5xx and anything else: `server_error`.
    """
    if code.startswith("2"):  # 1
        return "success"
    if code == "499":  # 2
        return "cancelled"
    return "client_error" if code.startswith("4") else "server_error"  # 3


def requests_family(samples: Iterable[Sample]) -> Metric:
    """`vllm_requests_total{model,tenant,status}` from `quorum_requests_total` samples,
    status codes of one class summed."""
    counts: dict[tuple[str, str, str], float] = {}
    for s in samples:
        if s.name != "quorum_requests_total":
            continue  # `_created`
        key = (s.labels["model"], s.labels["tenant"], status_class(s.labels["status"]))
        counts[key] = counts.get(key, 0.0) + s.value
    family = CounterMetricFamily(
        "vllm_requests_total", "Total requests processed", labels=["model", "tenant", "status"]
    )
    for key, value in counts.items():
        family.add_metric(list(key), value)
    return family


class SeedNames(Collector):
    """The seed's five series, read from the runner's metrics, queue and snapshot."""

    def __init__(
        self,
        metrics: Metrics,
        queue_depth: Callable[[], int],
        snapshot: Callable[[], ResourceSnapshot],
    ) -> None:
        self.metrics = metrics
        self.queue_depth = queue_depth
        self.snapshot = snapshot

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily("vllm_requests_total", "", labels=["model", "tenant", "status"])
        yield GaugeMetricFamily("vllm_cache_hit_rate", "", labels=["model"])
        yield GaugeMetricFamily("vllm_queue_depth", "")
        yield GaugeMetricFamily("vllm_gpu_memory_used", "", labels=["gpu"])

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        yield requests_family(s for f in m.requests.collect() for s in f.samples)
        hits = GaugeMetricFamily("vllm_cache_hit_rate", "Cache hit rate", labels=["model"])
        for model, rate in m.cache_hit_rates().items():
            hits.add_metric([model], rate)
        yield hits
        yield GaugeMetricFamily("vllm_queue_depth", "Current queue depth", self.queue_depth())
        used = GaugeMetricFamily("vllm_gpu_memory_used", "GPU memory used in bytes", labels=["gpu"])
        for gpu in self.snapshot().gpus:
            used.add_metric([str(gpu.index)], gpu.used_mb * MIB)
        yield used


def export_seed_names(
    metrics: Metrics,
    names: MetricsNames,
    queue_depth: Callable[[], int],
    snapshot: Callable[[], ResourceSnapshot],
) -> None:
    """Serve the seed's names per `names` (METRICS_NAMES): register `SeedNames` unless
    `quorum`; with `seed`, leave the `quorum_*` twins out of the exposition."""
    if names != "quorum":
        metrics.registry.register(SeedNames(metrics, queue_depth, snapshot))
        metrics.exposition.twins[DURATION] = (
            "vllm_inference_duration_seconds",
            "Inference duration",
        )
    if names == "seed":
        metrics.exposition.hidden = metrics.exposition.hidden | TWINS

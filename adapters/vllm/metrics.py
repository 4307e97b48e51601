"""vLLM's Prometheus metrics: what the runner reads from them, and how it re-exposes them.

vLLM serves `/metrics` in the Prometheus text format (prometheus_client), names prefixed
`vllm:` and labelled `model_name` (the served model name) and `engine` (the data-parallel
rank), registered in `vllm/v1/metrics/loggers.py` (`PrometheusStatLogger`):

- gauges `vllm:num_requests_running`, `vllm:num_requests_waiting`,
  `vllm:kv_cache_usage_perc` (0..1, "1 means 100 percent usage");
- counters `vllm:prefix_cache_queries` and `vllm:prefix_cache_hits` (in tokens), exposed
  with prometheus_client's `_total` suffix (`vllm:prefix_cache_hits_total`);
- histograms such as `vllm:request_queue_time_seconds`.

`/metrics` is not behind `--api-key` (it guards only `/v1`, `/v2`, `/inference`,
`/cohere`), so the engine must stay on 127.0.0.1 and `/metrics` must never be proxied to
tenants: its prefix-cache counters are global.

`scrape_metrics` is pure (text in, figures out). `VllmMetricsCollector` keeps the last
scrape of every vLLM engine and yields those families, names and labels unchanged, from
the registry the runner serves to the endpoint picker (`/metrics/picker` by default, not
`/metrics`: a `:` in a name is reserved for recording rules) ("standard vLLM metrics +
additions").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

PREFIX = "vllm:"


@dataclass(frozen=True, slots=True)
class VllmLoad:
    """What the runner needs from one scrape (summed over vLLM's `engine` label)."""

    kv_cache_usage: float  # 0..1; the mean over engines when there are several
    waiting: int
    running: int
    prefix_cache_hits: float  # tokens, cumulative
    prefix_cache_queries: float  # tokens, cumulative


def parse_families(text: str) -> list[Metric]:
    """The `vllm:*` metric families of a `/metrics` answer (others dropped).

    Raises ValueError on text that is not the Prometheus text format.
    """
    return [f for f in text_string_to_metric_families(text) if f.name.startswith(PREFIX)]


def load_from_families(families: Iterable[Metric]) -> VllmLoad:
    """The figures of `VllmLoad` out of parsed families.

    1. Gauges: `num_requests_running` and `num_requests_waiting` summed over samples,
       `kv_cache_usage_perc` averaged (one sample per engine).
    2. Counters: `prefix_cache_hits` / `prefix_cache_queries`, from their `_total` samples.
    3. A family that is absent counts as 0.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for family in families:
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            name = sample.name.removesuffix("_total")  # 2
            sums[name] = sums.get(name, 0.0) + sample.value  # 1
            counts[name] = counts.get(name, 0) + 1
    usage_n = counts.get("vllm:kv_cache_usage_perc", 0)
    return VllmLoad(
        kv_cache_usage=sums.get("vllm:kv_cache_usage_perc", 0.0) / usage_n if usage_n else 0.0,
        waiting=round(sums.get("vllm:num_requests_waiting", 0.0)),  # 3
        running=round(sums.get("vllm:num_requests_running", 0.0)),
        prefix_cache_hits=sums.get("vllm:prefix_cache_hits", 0.0),
        prefix_cache_queries=sums.get("vllm:prefix_cache_queries", 0.0),
    )


def scrape_metrics(text: str) -> VllmLoad:
    """`VllmLoad` out of vLLM's `/metrics` text (pure; ValueError when it is not Prometheus)."""
    return load_from_families(parse_families(text))


class VllmMetricsCollector:
    """A prometheus_client collector that re-yields the last scrape of each vLLM engine.

    Register one for all vLLM engines (`registry.register(collector)`); `update` after each
    scrape, `forget` when an engine is unloaded. Families with the same name from several
    engines are merged (their samples differ by `model_name`). `describe()` is empty, so
    registering does not collect and the names are not checked against other collectors:
    the `vllm:*` names the runner aggregates itself (the endpoint picker's gauges) are
    `shadow`ed here, so each name is yielded by one collector only.
    """

    def __init__(self) -> None:
        self._by_engine: dict[str, list[Metric]] = {}
        self.shadowed: frozenset[str] = frozenset()  # names the runner serves itself

    def shadow(self, names: Iterable[str]) -> None:
        """Yield no family named in `names`: the runner exports its own aggregate under
        those names (runner/telemetry/picker_metrics.py), and one name must carry one value."""
        self.shadowed = frozenset(names)

    def samples(self, name: str) -> list[Sample]:
        """Every engine's samples of the family `name` at its last scrape, shadowed or not."""
        return [
            s
            for families in list(self._by_engine.values())
            for family in families
            if family.name == name
            for s in family.samples
        ]

    def update(self, engine_id: str, families: list[Metric]) -> None:
        self._by_engine[engine_id] = families

    def forget(self, engine_id: str) -> None:
        self._by_engine.pop(engine_id, None)

    def engines(self) -> list[str]:
        """The engines whose last scrape is kept."""
        return list(self._by_engine)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for families in list(self._by_engine.values()):
            for family in families:
                if family.name in self.shadowed:
                    continue
                into = merged.get(family.name)
                if into is None:
                    into = Metric(family.name, family.documentation, family.type, family.unit)
                    merged[family.name] = into
                elif into.type != family.type:
                    continue
                into.samples.extend(family.samples)
        yield from merged.values()

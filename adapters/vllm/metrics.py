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

`scrape_metrics` is pure (text in, figures out). The families go to the runner's
`EngineFamilies` (adapters/engine_families.py keeps the last scrape of every engine that
hands its own and yields those families, names and labels unchanged), from
the registry the runner serves to the endpoint picker (`/metrics/picker` by default, not
`/metrics`: a `:` in a name is reserved for recording rules) ("standard vLLM metrics +
additions").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

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

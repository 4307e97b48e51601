"""Reading vLLM's /metrics text and re-exposing it (adapters/vllm/metrics.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from adapters.engine_families import EngineFamiliesCollector
from adapters.vllm.metrics import parse_families, scrape_metrics

# As vLLM's prometheus_client registry writes it (names from vllm/v1/metrics/loggers.py).
TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 400.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 100.0
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 9.0
"""


def test_scrape_metrics_reads_load_figures() -> None:
    """Running, waiting, KV usage and prefix-cache counters come out of vLLM's names."""
    load = scrape_metrics(TEXT)
    assert (load.running, load.waiting, load.kv_cache_usage) == (3, 5, 0.25)
    assert (load.prefix_cache_hits, load.prefix_cache_queries) == (100.0, 400.0)


def test_scrape_metrics_missing_families_read_zero() -> None:
    """An engine that has not served anything yet reads all zeros."""
    load = scrape_metrics("")
    assert (load.running, load.waiting, load.kv_cache_usage, load.prefix_cache_queries) == (
        0,
        0,
        0.0,
        0.0,
    )


def test_scrape_metrics_refuses_garbage() -> None:
    """Text that is not the Prometheus format raises ValueError."""
    with pytest.raises(ValueError):
        scrape_metrics("vllm:num_requests_running{engine= 3\n")


def test_collector_reexposes_vllm_families_unchanged() -> None:
    """The runner's registry yields the last scrape's `vllm:*` samples, names and labels kept."""
    registry = CollectorRegistry()
    collector = EngineFamiliesCollector()
    registry.register(collector)
    collector.update("m", parse_families(TEXT))
    out = generate_latest(registry).decode()
    assert 'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 100.0' in out
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25' in out
    assert "python_gc" not in out


def test_collector_merges_engines_and_forgets_unloaded_ones() -> None:
    """Two engines' samples share one family; an unloaded engine's samples disappear."""
    registry = CollectorRegistry()
    collector = EngineFamiliesCollector()
    registry.register(collector)
    collector.update("m", parse_families(TEXT))
    collector.update("n", parse_families(TEXT.replace('model_name="m"', 'model_name="n"')))
    out = generate_latest(registry).decode()
    assert out.count("# TYPE vllm:num_requests_running gauge") == 1
    assert 'model_name="n"' in out and 'model_name="m"' in out
    collector.forget("n")
    assert 'model_name="n"' not in generate_latest(registry).decode()

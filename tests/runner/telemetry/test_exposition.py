"""runner/telemetry/exposition.py writes what prometheus_client's `generate_latest` writes, with
families hidden and twins added as asked."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from runner.telemetry.exposition import Exposition
from runner.telemetry.series import LabelledCounter, LabelledGauge, LabelledHistogram

pytestmark = pytest.mark.timeout(30)


def _registry() -> CollectorRegistry:
    r = CollectorRegistry()
    Counter("c_requests", "Requests\nby \\ kind", ["model", "tenant"], registry=r).labels(
        "m", 'odd "t"\\\n'
    ).inc(3)
    Counter("plain", "No labels", registry=r).inc()
    h = Histogram("h_seconds", "Durations", ["model"], buckets=(0.1, 1.0), registry=r)
    h.labels("m").observe(0.5)
    h.labels("n").observe(2.0)
    Gauge("vllm:num_requests_waiting", "Waiting", registry=r).set(6)
    Info("build", "Build", registry=r).info({"version": "1"})
    scraped = GaugeMetricFamily("ts_gauge", "With a timestamp", labels=["a"])
    scraped.add_metric(["x"], 1.5, timestamp=1700000000.25)

    class Once:
        def collect(self):  # type: ignore[no-untyped-def]
            yield scraped

    r.register(Once())  # type: ignore[arg-type]
    return r


def test_exposition_writes_what_generate_latest_writes() -> None:
    """Byte for byte, for counters, histograms, info, gauges with `:` names, escaped label
    values and help, timestamps and `_created` series, on a first and a cached scrape."""
    registry = _registry()
    exposition = Exposition(registry)
    assert exposition.render() == generate_latest(registry)
    assert exposition.render()  # the cached text still matches == generate_latest(registry)


def test_exposition_hides_and_twins_families() -> None:
    """A hidden family is left out; a twin is written under its own name and help with the
    same samples (no `_created`), even when the original is hidden."""
    registry = _registry()
    exposition = Exposition(registry)
    exposition.hidden = frozenset({"h_seconds", "plain"})
    exposition.twins = {"h_seconds": ("seed_seconds", "Seed durations")}
    families = {f.name: f for f in text_string_to_metric_families(exposition.render().decode())}
    assert "h_seconds" not in families and "plain" not in families
    twin = families["seed_seconds"]
    assert twin.type == "histogram" and twin.documentation == "Seed durations"
    counts = {s.labels["model"]: s.value for s in twin.samples if s.name == "seed_seconds_count"}
    assert counts == {"m": 1.0, "n": 1.0}
    assert not any(s.name.endswith("_created") for s in twin.samples)
    assert "seed_seconds_created" not in families


def test_labelled_histogram_writes_what_prometheus_client_writes() -> None:
    """The request path's histogram gives the samples prometheus_client's `Histogram` gives
    for the same observations (bucket edges included), less `_created`."""
    buckets = (0.005, 0.1, 1, 2.5, 300)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = LabelledHistogram("d_seconds", "Durations", ["model"], buckets, registry=ours)
    reference = Histogram("d_seconds", "Durations", ["model"], buckets=buckets, registry=theirs)
    for model, amount in [("m", 0.005), ("m", 0.1), ("m", 0.2), ("n", 301.0), ("m", 0.0)]:
        mine.labels(model).observe(amount)
        reference.labels(model).observe(amount)
    created = re.compile(r"^.*_created.*\n", re.M)
    assert Exposition(ours).render().decode() == created.sub("", generate_latest(theirs).decode())


def test_labelled_counter_and_gauge_write_what_prometheus_client_writes() -> None:
    """The request path's counters and gauges give the samples prometheus_client's
    `Counter` and `Gauge` give for the same updates, less `_created`; a counter refuses a
    negative amount with prometheus_client's error."""
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    count = LabelledCounter("r", "Requests", ["model", "status"], registry=ours)
    level = LabelledGauge("r_in_flight", "In flight", ["model"], registry=ours)
    ref_count = Counter("r", "Requests", ["model", "status"], registry=theirs)
    ref_level = Gauge("r_in_flight", "In flight", ["model"], registry=theirs)
    for model, status in [("m", "200"), ("n", "429"), ("m", "200")]:
        count.labels(model, status).value += 1
        ref_count.labels(model, status).inc()
        level.labels(model).value += 1
        ref_level.labels(model).inc()
    count.labels("m", "200").inc(2.5)
    ref_count.labels("m", "200").inc(2.5)
    level.labels("n").value -= 1
    ref_level.labels("n").dec()
    created = re.compile(r"^.*_created.*\n", re.M)
    assert Exposition(ours).render().decode() == created.sub("", generate_latest(theirs).decode())
    with pytest.raises(ValueError) as mine:
        count.labels("m", "200").inc(-1)
    with pytest.raises(ValueError) as reference:
        ref_count.labels("m", "200").inc(-1)
    assert str(mine.value) == str(reference.value)
    with pytest.raises(ValueError, match="takes labels"):
        count.labels("m")

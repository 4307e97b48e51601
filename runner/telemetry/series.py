"""Labelled Prometheus series for the request path, cheap to update and to collect.

prometheus_client's children take a lock per update (a counter's `inc` is three calls of
checks and a lock; a histogram's one lock per bucket) and its `labels()` looks the child
up through several calls; a histogram builds every bucket's `le` text again at each
collect (~80 µs a child), and the endpoint picker scrapes `/metrics` 20 times a second.
Here a child is plain numbers, updated on the event-loop thread: a counter's or gauge's
`value` (`child.value += n`, no call), a histogram's bucket counts and sum (one bisect).
`collect` writes the samples prometheus_client's `Counter`, `Gauge` and `Histogram` would
(less `_created`; tests/runner/telemetry/test_exposition.py and test_metrics_updates.py
compare them).
A scrape on METRICS_PORT's thread may read a child while it is updated: the figures of
one scrape can then be one update apart, never corrupt.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Exemplar, Sample

from runner.telemetry.exposition import go_float

C = TypeVar("C")
_NONE: list[Exemplar | None] = []


class HistogramChild:
    """One label set: counts per bucket (the last one `+Inf`) and their sum; with
    tracing on, each bucket's last traced observation as its exemplar (OpenMetrics)."""

    __slots__ = ("bounds", "counts", "exemplars", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.exemplars: list[Exemplar | None] | None = None  # none until one is traced

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount

    def observe_traced(self, amount: float, trace_id: str, span_id: str) -> None:
        """`observe`, the observation kept as its bucket's exemplar (the trace it was in)."""
        index = bisect_left(self.bounds, amount)
        self.counts[index] += 1
        self.sum += amount
        if self.exemplars is None:
            self.exemplars = [None] * len(self.counts)
        labels = {"trace_id": trace_id, "span_id": span_id}
        self.exemplars[index] = Exemplar(labels, amount, time.time())


class _Labelled(Collector, Generic[C]):
    """Children by label values (`labels(*values)`), registered on `registry` at once."""

    kind = "untyped"

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], C] = {}
        registry.register(self)

    def labels(self, *values: str) -> C:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}")
            child = self._children[values] = self._new_child()
        return child

    def _new_child(self) -> C:
        raise NotImplementedError

    def describe(self) -> Iterator[Metric]:
        yield Metric(self.name, self.documentation, self.kind)


class CounterChild:
    """One label set's count: add to `value` (never a negative amount), or `inc(n)`."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        if amount < 0:  # prometheus_client's words
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class GaugeChild:
    """One label set's level: `value` moved up and down."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0


class LabelledCounter(_Labelled[CounterChild]):
    """`labels(*values)` like prometheus_client's `Counter` (`name` without `_total`; its
    samples are `name_total`)."""

    kind = "counter"

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def collect(self) -> Iterator[Metric]:
        family = Metric(self.name, self.documentation, "counter")
        total = self.name + "_total"
        for values, child in list(self._children.items()):
            labels = dict(zip(self.labelnames, values, strict=True))
            family.samples.append(Sample(total, labels, child.value))
        yield family


class LabelledGauge(_Labelled[GaugeChild]):
    """`labels(*values)` like prometheus_client's `Gauge`."""

    kind = "gauge"

    def _new_child(self) -> GaugeChild:
        return GaugeChild()

    def collect(self) -> Iterator[Metric]:
        family = Metric(self.name, self.documentation, "gauge")
        for values, child in list(self._children.items()):
            labels = dict(zip(self.labelnames, values, strict=True))
            family.samples.append(Sample(self.name, labels, child.value))
        yield family


class LabelledHistogram(_Labelled[HistogramChild]):
    """`labels(*values).observe(x)` like prometheus_client's `Histogram`."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.bounds = tuple(float(b) for b in buckets if b != math.inf)
        self._les = [go_float(b) for b in self.bounds] + ["+Inf"]
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self.bounds)

    def collect(self) -> Iterator[Metric]:
        family = Metric(self.name, self.documentation, "histogram")
        bucket, count, total = self.name + "_bucket", self.name + "_count", self.name + "_sum"
        samples = family.samples
        for values, child in list(self._children.items()):
            labels = dict(zip(self.labelnames, values, strict=True))
            running = 0
            exemplars = child.exemplars or _NONE
            for i, (le, n) in enumerate(zip(self._les, list(child.counts), strict=True)):
                running += n
                exemplar = exemplars[i] if exemplars is not _NONE else None
                samples.append(Sample(bucket, {**labels, "le": le}, float(running), None, exemplar))
            samples.append(Sample(count, labels, float(running)))
            samples.append(Sample(total, labels, child.sum))
        yield family

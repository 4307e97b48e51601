"""The runner's one `EngineFamilies` (adapters/kind.py): the metric families engines expose
themselves, as last scraped, re-yielded from the registry the runner serves to the endpoint
picker. Kind-neutral: whichever kind hands families (`Host.families`) has them served here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample


class EngineFamiliesCollector:
    """A prometheus_client collector that re-yields the last scrape of each engine that
    hands its own families (`Host.families`: vLLM's `/metrics`, adapters/vllm/metrics.py).

    Register one for all engines (`registry.register(collector)`); `update` after each
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

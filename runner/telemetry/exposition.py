"""The Prometheus text format (0.0.4) of the runner's registry, cheap enough for the
endpoint picker's 20 scrapes a second.

It writes what prometheus_client's `generate_latest` writes, byte for byte, but keeps the
text of each family's `# HELP`/`# TYPE` lines and of each series' name and labels between
scrapes, so a scrape costs the collectors' work and one float formatting per sample
(tests/runner/telemetry/test_exposition.py compares the two). `twins` writes a family again under
another name right after it (the seed's `vllm_inference_duration_seconds` beside
`quorum_inference_duration_seconds`) without collecting it twice; `hidden` families are
left out. One exposition may write several sources, one after the other (`/metrics` with
the endpoint picker's `vllm:*` families merged in, PICKER_METRICS_PATH=/metrics). Metric
and label names are the runner's own or vLLM's, valid in the classic format, so they are
written unescaped; label values are escaped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

OPENMETRICS = b"application/openmetrics-text"  # in a scraper's Accept: it takes OpenMetrics
OPENMETRICS_TYPE = openmetrics.CONTENT_TYPE_LATEST.encode()
MAX_CACHED = 50_000  # series texts kept (tenant labels are capped, so this is ample)
_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}
_OPENMETRICS_ONLY = ("_created", "_gsum", "_gcount")


def go_float(value: float) -> str:
    """A sample's value as the text format writes it (prometheus_client's rules)."""
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


class Exposition(Collector):
    """The families of `sources`, in order, as served: `hidden` ones left out, `twins`
    added.

    `collect()` yields them (for prometheus_client's own server on METRICS_PORT);
    `render()` writes them in the text format with cached text.
    """

    def __init__(self, *sources: Collector) -> None:
        self.sources = sources
        self.hidden: frozenset[str] = frozenset()
        self.twins: dict[str, tuple[str, str]] = {}  # family -> (twin's name, its help)
        self._heads: dict[tuple[str, str, str], str] = {}
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}

    def collect(self) -> Iterator[Metric]:
        for source in self.sources:
            for family in source.collect():
                if family.name not in self.hidden:
                    yield family
                twin = self.twins.get(family.name)
                if twin is not None:
                    yield _renamed(family, *twin)

    def render(self) -> bytes:
        out: list[str] = []
        for family in self.collect():
            self._family(out, family.name, family.type, family.documentation, family.samples)
        if len(self._series) > MAX_CACHED:
            self._series.clear()
        return "".join(out).encode()

    def render_openmetrics(self) -> bytes:
        """The same families in the OpenMetrics text format, written by prometheus_client,
        histogram buckets with their exemplars (a trace id); for a scraper that asks."""
        data: bytes = openmetrics.generate_latest(self)  # type: ignore[no-untyped-call]
        return data

    def _family(
        self, out: list[str], name: str, kind: str, help_text: str, samples: Iterable[Sample]
    ) -> None:
        """1. The header, as `generate_latest` munges OpenMetrics types into the classic
        format. 2. The samples, OpenMetrics-only ones (`_created`, ...) held back. 3. Those
        as gauges of their own after the family."""
        key = (name, kind, help_text)
        head = self._heads.get(key)
        if head is None:  # 1
            shown = name + "_total" if kind == "counter" else name
            shown = shown + "_info" if kind == "info" else shown
            head = f"# HELP {shown} {_escape_help(help_text)}\n"
            head += f"# TYPE {shown} {_TYPES.get(kind, kind)}\n"
            self._heads[key] = head
        out.append(head)
        held: dict[str, list[str]] = {}
        for s in samples:  # 2
            line = self._line(s)
            for suffix in _OPENMETRICS_ONLY:
                if s.name == name + suffix:
                    held.setdefault(suffix, []).append(line)
                    break
            else:
                out.append(line)
        for suffix, lines in held.items():  # 3
            out.append(f"# HELP {name}{suffix} {_escape_help(help_text)}\n")
            out.append(f"# TYPE {name}{suffix} gauge\n")
            out.extend(lines)

    def _line(self, s: Sample) -> str:
        labels = tuple(s.labels.items())
        key = (s.name, labels)
        series = self._series.get(key)
        if series is None:
            series = s.name
            if labels:
                pairs = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(labels))
                series += "{" + pairs + "}"
            self._series[key] = series = series + " "
        stamp = "" if s.timestamp is None else f" {int(float(s.timestamp) * 1000):d}"
        return series + go_float(s.value) + stamp + "\n"


def _renamed(family: Metric, name: str, help_text: str) -> Metric:
    """`family` under `name`, its `_created` samples left out."""
    twin = Metric(name, help_text, family.type)
    old = len(family.name)
    twin.samples = [
        Sample(name + s.name[old:], s.labels, s.value, s.timestamp)
        for s in family.samples
        if not s.name.endswith("_created")
    ]
    return twin

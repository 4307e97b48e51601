"""deploy/grafana: the dashboard checked against Grafana's own schema for the version it
declares (npm @grafana/schema, pinned in tests/deploy/node, type-checked by tsc), and every
query against the metrics a real runner exports on /metrics."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.tools import ROOT, node, typecheck
from tests.support.runner_proc import start_runner

DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "quorum.json"
_PANELCFG = "@grafana/schema/dist/esm/raw/composable/{0}/panelcfg/x/{1}PanelCfg_types.gen"
PANEL_TYPES = {"timeseries": "TimeSeries", "stat": "Stat"}  # panel type -> its schema module
# Grafana's built-in variables, replaced by a value of their kind before a query is parsed.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
# The series names each metric type exposes (Prometheus' text format conventions).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "unknown": ("",),
}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def _metric_names(expr: str) -> set[str]:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    names: set[str] = set()

    def visit(node: object) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expr!r}"
            names.add(node.name)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def _exported_series(text: str) -> set[str]:
    series: set[str] = set()
    for family in text_string_to_metric_families(text):
        series.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return series


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """The series a real runner (no models) exports, read off its /metrics."""
    with start_runner(models={}) as runner:
        text = httpx.get(runner.url + "/metrics", timeout=10).text
    return _exported_series(text)


def _grafana_checks(dashboard: dict[str, Any]) -> tuple[list[str], list[tuple[str, object]]]:
    imports = ["import type { Dashboard } from '@grafana/schema';"]
    checks: list[tuple[str, object]] = [("Dashboard", dashboard)]
    for kind, module in PANEL_TYPES.items():
        imports.append(f"import type * as {module} from '{_PANELCFG.format(kind, module)}';")
    for panel in _panels(dashboard):
        if panel["type"] == "row":
            continue
        schema = PANEL_TYPES.get(panel["type"])
        assert schema, f"panel {panel['title']!r}: no schema for type {panel['type']!r}"
        checks.append((f"{schema}.Options", panel.get("options", {})))
        custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom")
        if custom is not None:
            checks.append((f"{schema}.FieldConfig", custom))
    return imports, checks


@pytest.mark.timeout(120)
def test_grafana_dashboard_valid_for_the_schema_version_it_declares(
    dashboard: dict[str, Any], tmp_path: Path
) -> None:
    """The dashboard declares the schemaVersion of the pinned @grafana/schema, and it and
    each panel's options type-check against that release's types."""
    script = (
        "import { defaultDashboard } from '@grafana/schema';"
        "console.log(defaultDashboard.schemaVersion);"
    )
    assert dashboard["schemaVersion"] == int(node(script))
    imports, checks = _grafana_checks(dashboard)
    assert typecheck(tmp_path, imports, checks) == ""


@pytest.mark.timeout(120)
def test_grafana_typecheck_rejects_a_misspelt_option(
    dashboard: dict[str, Any], tmp_path: Path
) -> None:
    """A misspelt panel option fails the type check (the check is not vacuous)."""
    dashboard = copy.deepcopy(dashboard)
    panel = next(p for p in dashboard["panels"] if p["type"] == "timeseries")
    panel["options"]["tooltip"]["mod"] = panel["options"]["tooltip"].pop("mode")
    imports, checks = _grafana_checks(dashboard)
    assert "'\"mod\"' does not exist" in typecheck(tmp_path, imports, checks)


def test_grafana_queries_name_only_metrics_the_runner_exports(
    dashboard: dict[str, Any], exported: set[str]
) -> None:
    """Every query parses as PromQL and names only series the runner exports today."""
    missing = [
        f"panel {title!r}: {name} (in {expr!r})"
        for title, expr in _queries(dashboard)
        for name in sorted(_metric_names(expr))
        if name not in exported
    ]
    assert not missing, "metrics the runner does not export:\n" + "\n".join(missing)


def test_grafana_every_panel_has_a_query_on_the_datasource_variable(
    dashboard: dict[str, Any],
) -> None:
    """Panels query the dashboard's Prometheus variable (any provisioned Prometheus works)."""
    (variable,) = dashboard["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"
    for panel in _panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert re.fullmatch(r"\$\{?datasource\}?", target["datasource"]["uid"]), panel["title"]

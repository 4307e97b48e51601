"""The seed contract's metric names (runner/telemetry/seed_metrics.py): derived from the
runner's own series at scrape time, served by default, and a real runner's /metrics clean by
`promtool check metrics`."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from runner.memory.telemetry import GpuInfo
from runner.telemetry.metrics import Metrics
from runner.telemetry.seed_metrics import export_seed_names, requests_family, status_class
from runner.telemetry.snapshot import ResourceSnapshot
from tests.deploy.tools import promtool
from tests.support.fleet import Model, runner
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess

pytestmark = pytest.mark.timeout(120)

# name as the text format's parser gives it -> (type, labels of its samples, less `le`)
SEED = {
    "vllm_requests": ("counter", {"model", "tenant", "status"}),
    "vllm_cache_hit_rate": ("gauge", {"model"}),
    "vllm_queue_depth": ("gauge", set()),
    "vllm_gpu_memory_used": ("gauge", {"gpu"}),
    "vllm_inference_duration_seconds": ("histogram", {"model"}),
}


def test_status_class_folds_http_codes() -> None:
    """2xx is the seed's `success`, 499 `cancelled`, other 4xx `client_error`, 5xx
    `server_error`."""
    assert [status_class(c) for c in ("200", "202", "499", "429", "503")] == [
        "success",
        "success",
        "cancelled",
        "client_error",
        "server_error",
    ]


def test_requests_family_sums_codes_of_one_class() -> None:
    """Codes of one class add up under one `status`; `_created` samples are left out."""
    labels = {"model": "m", "tenant": "t"}
    family = requests_family(
        [
            Sample("quorum_requests_total", {**labels, "status": "503"}, 2.0),
            Sample("quorum_requests_total", {**labels, "status": "502"}, 1.0),
            Sample("quorum_requests_created", {**labels, "status": "502"}, 1.7e9),
            Sample("quorum_requests_total", {**labels, "status": "200"}, 5.0),
        ]
    )
    assert family.type == "counter"
    assert {s.labels["status"]: s.value for s in family.samples} == {
        "server_error": 3.0,
        "success": 5.0,
    }
    assert {s.name for s in family.samples} == {"vllm_requests_total"}


def _names(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text)}


@pytest.mark.parametrize(
    ("mode", "seed", "quorum"),
    [("both", True, True), ("seed", True, False), ("quorum", False, True)],
)
def test_metrics_names_setting_chooses_the_names(mode: str, seed: bool, quorum: bool) -> None:
    """METRICS_NAMES: `both` serves the seed's and the quorum_* names, `seed` leaves the
    five quorum_* twins out (others stay), `quorum` serves no seed name."""
    metrics = Metrics()
    gpu = GpuInfo(0, "g", total_mb=80_000, used_mb=1024, free_mb=78_976, utilization=None)
    snapshot = ResourceSnapshot(gpus=(gpu,))
    export_seed_names(metrics, mode, lambda: 3, lambda: snapshot)  # type: ignore[arg-type]
    metrics.count_request("m", "t", 200)
    metrics.begin_request("m")
    metrics.end_request("m", 0.2)
    names = _names(metrics.render().decode())
    assert (set(SEED) <= names) is seed
    assert set(SEED).isdisjoint(names) is not seed
    assert ("quorum_requests" in names) is quorum
    assert ("quorum_inference_duration_seconds" in names) is quorum
    assert "quorum_requests_in_flight" in names  # no seed twin: always served
    if seed:
        text = metrics.render().decode()
        assert "vllm_queue_depth 3.0" in text
        assert 'vllm_gpu_memory_used{gpu="0"} 1.073741824e+09' in text


@pytest.fixture(scope="module")
def served() -> Iterator[RunnerProcess]:
    # community-x is declared (an env limit): the tenant label names declared tenants only
    env = {"TENANT_RATE_LIMIT_community-x": "unlimited"}
    with runner("seed", models={"m": Model("llama-server-ok", preload=True)}, env=env) as r:
        answer = httpx.post(
            r.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers={"X-Tenant-ID": "community-x"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        yield r


def _scrape(r: RunnerProcess) -> str:
    return httpx.get(r.url + "/metrics", timeout=5).text


def test_metrics_default_serves_the_seeds_five_series(served: RunnerProcess) -> None:
    """By default /metrics carries the seed's five series by the seed's names, types and
    labels, with this request counted, beside the quorum_* names."""
    eventually(lambda: 'vllm_gpu_memory_used{gpu="' in _scrape(served))
    text = _scrape(served)
    found = {f.name: f for f in text_string_to_metric_families(text)}
    for name, (kind, labels) in SEED.items():
        assert found[name].type == kind, name
        assert found[name].samples, name
        for s in found[name].samples:
            assert set(s.labels) - {"le"} == labels, (name, s.labels)
    requests = {
        tuple(sorted(s.labels.items())): s.value
        for s in found["vllm_requests"].samples
        if s.name == "vllm_requests_total"
    }
    key = (("model", "m"), ("status", "success"), ("tenant", "community-x"))
    assert requests[key] == 1
    count = [
        s for s in found["vllm_inference_duration_seconds"].samples if s.name.endswith("_count")
    ]
    assert [(s.labels, s.value) for s in count] == [({"model": "m"}, 1.0)]
    assert [s.value for s in found["vllm_queue_depth"].samples] == [0]
    assert "quorum_requests" in found  # the dashboard's names stay


def test_metrics_promtool_check_metrics_is_clean(served: RunnerProcess) -> None:
    """`promtool check metrics` finds nothing to say about /metrics as served, unfiltered:
    the endpoint picker's `vllm:*` names (a ':' promtool flags) are on /metrics/picker."""
    text = _scrape(served)
    assert "vllm:" not in text
    checked = promtool("check", "metrics", stdin=text)
    assert checked.returncode == 0 and not (checked.stdout + checked.stderr).strip(), checked

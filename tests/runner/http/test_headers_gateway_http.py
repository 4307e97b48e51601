"""A request routed by the Inference Gateway: its fairness id is the tenant, its objective
the priority (real runner and fake engine subprocesses)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.launch import start_fake
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, start_runner
from tests.support.tokens import FAIRNESS, gateway_env

pytestmark = pytest.mark.timeout(90)

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


def _post(runner: RunnerProcess, headers: dict[str, str], content: str = "hi") -> httpx.Response:
    body = {**CHAT, "messages": [{"role": "user", "content": content}]}
    return httpx.post(runner.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def _samples(runner: RunnerProcess, family_suffix: str, **labels: str) -> float:
    """The sum of the samples of /metrics' families named `*<suffix>` with these labels
    (whatever prefix the metric names carry)."""
    total = 0.0
    for family in text_string_to_metric_families(httpx.get(runner.url + "/metrics").text):
        if not family.name.endswith(family_suffix):
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and labels.items() <= sample.labels.items():
                total += sample.value
    return total


@contextmanager
def _blocking_stream(runner: RunnerProcess) -> Iterator[None]:
    """Hold the model's only slot with a long stream until the block ends."""
    body = {**CHAT, "stream": True, "messages": [{"role": "user", "content": "blocker"}]}
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST", runner.url + "/v1/chat/completions", json=body, headers={FAIRNESS: "t0"}
        ) as resp,
    ):
        assert resp.status_code == 200
        chunks = resp.iter_raw()  # keep a reference: dropping it would hang up at once
        next(chunks)
        yield


def _waiting_by_tenant(runner: RunnerProcess) -> list[dict[str, Any]]:
    state = httpx.get(runner.url + "/ui/state.json", headers={FAIRNESS: "ops"}).json()
    rows: list[dict[str, Any]] = state["queues"]["byTenant"]
    return rows


def test_gateway_fairness_id_alone_is_rate_limited_as_its_tenant() -> None:
    """Only `x-llm-d-inference-fairness-id: t1`: t1's 2 req/min let two through, the
    third is 429 naming t1; another tenant is unaffected, and /metrics counts them as t1."""
    env = {"TENANT_RATE_LIMIT_t1": "2req/min"}
    with (
        start_fake("fake_openai", "--latency-ms", "0") as engine,
        start_runner({"echo": engine.url}, env=env) as r,
    ):
        gateway = {"x-llm-d-inference-fairness-id": "t1"}
        oks = [_post(r, gateway) for _ in range(2)]
        assert [o.status_code for o in oks] == [200, 200]
        assert [o.headers["ratelimit-remaining"] for o in oks] == ["1", "0"]
        refused = _post(r, gateway)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert "t1" in refused.json()["error"]["message"]
        assert _post(r, gateway).status_code == 429  # still t1
        assert _post(r, {**gateway, "X-Tenant-ID": "other"}).status_code == 200  # header wins
        assert engine.received("/v1/chat/completions") == 3
        assert _samples(r, "requests", tenant="t1", status="200") == 2
        assert _samples(r, "requests", tenant="t1", status="429") == 2
        assert _samples(r, "rejections", tenant="t1", reason="rate_limited") == 2
        # `other` is declared nowhere: its label is `_other` (bounded by the configuration)
        assert _samples(r, "requests", tenant="_other", status="200") == 1


def test_gateway_fairness_id_and_objective_queue_as_tenant_and_priority(tmp_path: Path) -> None:
    """With the one slot busy, a request with only the gateway's headers waits in t1's
    queue at the objective's priority (the status page shows it), and `critical` from t2
    overtakes t1's `low` (where the tenants file lets requests ask for `high`)."""
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text("defaults:\n  priority: {max: high}\ntenants: {}\n")
    env = {**gateway_env(), "TENANTS_FILE": str(tenants)}
    with (
        start_fake(
            "fake_openai", "--latency-ms", "0", "--chunks", "50", "--chunk-delay-ms", "200"
        ) as engine,
        start_runner({"echo": engine.url}, parallel=1, env=env) as r,
        ThreadPoolExecutor(2) as pool,
    ):
        with _blocking_stream(r):
            low = pool.submit(
                _post,
                r,
                {"x-llm-d-inference-fairness-id": "t1", "x-gateway-inference-objective": "low"},
                "t1-low",
            )
            eventually(lambda: _waiting_by_tenant(r) != [])
            assert _waiting_by_tenant(r) == [{"tenant": "t1", "high": 0, "normal": 0, "low": 1}]
            high = pool.submit(
                _post,
                r,
                {"x-llm-d-inference-fairness-id": "t2", "x-llm-d-inference-objective": "critical"},
                "t2-critical",
            )
            eventually(lambda: len(_waiting_by_tenant(r)) == 2)
            assert _waiting_by_tenant(r)[1] == {"tenant": "t2", "high": 1, "normal": 0, "low": 0}
        assert low.result().status_code == 200 and high.result().status_code == 200
        order = [body["messages"][0]["content"] for body in engine.bodies("/v1/chat/completions")]
        assert order == ["blocker", "t2-critical", "t1-low"]
        # t1 and t2 are declared nowhere: counted under `_other` (labels are bounded)
        assert _samples(r, "requests", tenant="_other", status="200") == 2

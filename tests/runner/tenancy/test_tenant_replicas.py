"""Tenant policy across two runner replicas on one real Redis and one engine (the fake
OpenAI server, 300 ms an answer): an in-flight cap of 2 holds across both (the engine
never sees a third), a budget is shared, and a governed policy change taken by one
replica applies on the other within a second, without a restart."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from governance.encoding import policy_sha256
from tests.fixtures.launch import start_fake
from tests.support.redis_server import RedisServer
from tests.support.runner_proc import RunnerProcess, start_runner
from tests.support.tokens import DEV_REGISTRY, dev_token

pytestmark = pytest.mark.timeout(120)

TENANTS = """
tenants:
  capped:
    max_in_flight: 2
  metered:
    token_budgets: [{tokens: 1000, per: day}]
"""


WORDS = " ".join(f"w{i}" for i in range(60))  # the fake echoes it: ~60 tokens each way


def chat(content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "echo", "messages": [{"role": "user", "content": content}], **extra}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunnerProcess, ...]]:
    path: Path = tmp_path_factory.mktemp("tenants") / "tenants.yaml"
    path.write_text(TENANTS)
    server = RedisServer().start()
    with ExitStack() as stack:
        stack.callback(server.stop)
        engine = stack.enter_context(start_fake("fake_openai", "--latency-ms", "300"))
        env = {"REDIS_URL": server.url, "TENANTS_FILE": str(path),
               "GOVERNANCE_REGISTRY": str(DEV_REGISTRY)}  # fmt: skip
        runners = tuple(
            stack.enter_context(start_runner({"echo": engine.url}, env={**env, "RUNNER_ID": rid}))
            for rid in ("tenant-a", "tenant-b")
        )
        yield (*runners, engine)  # type: ignore[misc]


def test_tenant_replicas_in_flight_cap_holds_across_both(pair: tuple[Any, ...]) -> None:
    """12 requests of a tenant capped at 2, half to each replica, all at once: every one
    is served (none refused) and the engine never has more than 2 of them at once."""
    a, b, engine = pair
    httpx.post(engine.url + "/_fake/reset")
    head = {"X-Tenant-ID": "capped"}
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(
            lambda i: httpx.post((a, b)[i % 2].url + "/v1/chat/completions", json=chat(),
                                 headers=head, timeout=60),
            range(12),
        ))  # fmt: skip
    assert [x.status_code for x in answers] == [200] * 12, [x.text for x in answers]
    stats = httpx.get(engine.url + "/_fake/stats").json()
    assert stats["max_in_flight"] == 2


def test_tenant_replicas_share_one_budget(pair: tuple[Any, ...]) -> None:
    """A 1000-token budget is one budget across both replicas: alternating requests stop
    being admitted at the same total, whichever replica they reach."""
    a, b, _ = pair
    head = {"X-Tenant-ID": "metered"}
    served = refused = 0
    for i in range(16):
        answer = httpx.post((a, b)[i % 2].url + "/v1/chat/completions",
                            json=chat(WORDS, max_tokens=60), headers=head, timeout=30)  # fmt: skip
        if answer.status_code == 200:
            served += answer.json()["usage"]["total_tokens"]
        else:
            assert answer.json()["error"]["code"] == "token_budget_exceeded"
            refused += 1
    assert refused and served <= 1000


def test_tenant_replicas_policy_change_applies_on_both_within_a_second(
    pair: tuple[Any, ...],
) -> None:
    """A governed PUT on replica a: replica b refuses the tenant's model (403) within 1 s."""
    a, b, _ = pair
    head = {"X-Tenant-ID": "late"}
    assert httpx.post(b.url + "/v1/chat/completions", json=chat(), headers=head).status_code == 200
    policy = {"models": ["nothing-*"]}
    token = dev_token("tenant-policy", None, {"tenantId": "late",
                      "policySha256": policy_sha256(policy)}, aud="tenant-a")  # fmt: skip
    put = httpx.put(a.url + "/v1/tenants/late", json={"policy": policy, "verifiedOpToken": token})
    assert put.status_code == 200, put.text
    changed_at = time.monotonic()
    while True:
        answer = httpx.post(b.url + "/v1/chat/completions", json=chat(), headers=head)
        if answer.status_code == 403:
            break
        assert time.monotonic() - changed_at < 1.0, "replica b still serves the old policy"
    assert answer.json()["error"]["code"] == "model_not_allowed"
    listed = httpx.get(b.url + "/v1/tenants", headers={"X-Tenant-ID": "ops"})
    assert listed.status_code == 403  # no ADMIN_TENANTS here: the list is for admins only

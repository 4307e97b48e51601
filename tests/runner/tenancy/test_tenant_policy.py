"""A tenant's policy through a real runner (one process, embedded stores) in front of the
fake OpenAI engine (it reports usage as llama-server does): entitlements, the priority
ceiling, token budgets with their headers and reconciliation (whole, streamed, cancelled),
usage, and policy changed by governed tokens (PUT/DELETE /v1/tenants/{id}), key rotation
and SIGHUP."""

from __future__ import annotations

import hashlib
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from governance.encoding import policy_sha256
from tests.fixtures.launch import start_fake
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, start_runner
from tests.support.tokens import DEV_REGISTRY, dev_token

pytestmark = pytest.mark.timeout(90)

KEY_OPS = "ops-key-0123456789abcdef0123456789abcd"  # 32+ characters, as keys must be
KEY_ACME = "acme-key-0123456789abcdef0123456789abc"
KEY_NEW = "acme-key-rotated-99-0123456789abcdef012"


def digest(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


TENANTS = f"""
tenants:
  ops:
    api_keys: ["{digest(KEY_OPS)}"]
    priority: {{max: high}}
  acme:
    api_keys: ["{digest(KEY_ACME)}"]
    models: ["echo*"]
    priority: {{default: low, max: normal}}
    token_budgets:
      - {{tokens: 3000, per: hour}}
  globex:
    api_keys: ["globex-key-0123456789abcdef0123456789"]
"""


def chat(model: str = "echo", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi there"}], **extra}


def auth(key: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **headers}


@pytest.fixture
def r(tmp_path: Path) -> Iterator[RunnerProcess]:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    with (
        start_fake("fake_openai", "--latency-ms", "0", "--chunks", "6") as echo,
        start_fake("fake_openai", "--latency-ms", "0") as other,
        start_fake("fake_openai", "--chunks", "200", "--chunk-delay-ms", "50") as slow,
        start_fake("fake_dies_midstream", "--how", "abort", "--after", "3") as dies,
        start_runner(
            {"echo": echo.url, "secret": other.url, "echo-slow": slow.url, "echo-dies": dies.url},
            env={
                "TENANTS_FILE": str(path),
                "ADMIN_TENANTS": "ops",
                "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
            },
        ) as runner,
    ):
        yield runner


def remaining(answer: httpx.Response) -> int:
    return int(answer.headers["x-ratelimit-remaining-tokens"])


def test_tenant_policy_entitlements_refuse_and_filter(r: RunnerProcess) -> None:
    """A model outside the tenant's `models` is 403 model_not_allowed before any queueing;
    /v1/models lists only its models; another tenant sees every model."""
    refused = httpx.post(
        r.url + "/v1/chat/completions", json=chat("secret"), headers=auth(KEY_ACME)
    )
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "model_not_allowed"
    assert refused.headers["x-effective-priority"] == "low"
    listed = httpx.get(r.url + "/v1/models", headers=auth(KEY_ACME)).json()["data"]
    assert sorted(m["id"] for m in listed) == ["echo", "echo-dies", "echo-slow"]  # echo*
    everything = httpx.get(r.url + "/v1/models", headers=auth(KEY_OPS)).json()["data"]
    assert sorted(m["id"] for m in everything) == ["echo", "echo-dies", "echo-slow", "secret"]


def test_tenant_policy_priority_default_and_ceiling(r: RunnerProcess) -> None:
    """Without X-Priority a request is served at the tenant's default; above its max, at
    its max (`normal` unless granted); every answer says which (X-Effective-Priority)."""
    url = r.url + "/v1/chat/completions"
    plain = httpx.post(url, json=chat(max_tokens=4), headers=auth(KEY_ACME))
    high = httpx.post(
        url, json=chat(max_tokens=4), headers=auth(KEY_ACME, **{"X-Priority": "high"})
    )
    other = httpx.post(url, json=chat(), headers=auth(KEY_OPS, **{"X-Priority": "high"}))
    assert plain.headers["x-effective-priority"] == "low"
    assert high.headers["x-effective-priority"] == "normal"
    assert other.headers["x-effective-priority"] == "high"
    globex = auth("globex-key-0123456789abcdef0123456789", **{"X-Priority": "high"})
    ungranted = httpx.post(url, json=chat(), headers=globex)  # no policy: the default ceiling
    assert ungranted.headers["x-effective-priority"] == "normal"


def test_tenant_policy_budget_reserves_and_reconciles(r: RunnerProcess) -> None:
    """The remaining tokens after each answer are the budget minus what the engine
    reported (whole and streamed), a cancelled stream pays what it generated, a request
    that cannot fit is 429 token_budget_exceeded with Retry-After and the headers."""
    url = r.url + "/v1/chat/completions"
    first = httpx.post(url, json=chat(max_tokens=5), headers=auth(KEY_ACME))
    used = first.json()["usage"]["total_tokens"]
    # the reservation (bound) is what the headers show on this answer; the settlement follows
    assert remaining(first) <= 3000 - used
    second = httpx.post(url, json=chat(max_tokens=5), headers=auth(KEY_ACME))
    used += second.json()["usage"]["total_tokens"]
    assert int(second.headers["x-ratelimit-limit-tokens"]) == 3000
    body = chat(max_tokens=6, stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", url, json=body, headers=auth(KEY_ACME)) as streamed:
        events = [line for line in streamed.iter_lines() if line.startswith("data: {")]
    usage = [json.loads(e[6:])["usage"] for e in events if '"usage"' in e][-1]
    used += usage["total_tokens"]
    # what is left now is exactly the budget minus the engine's figures
    probe = chat(max_tokens=1)
    after = httpx.post(url, json=probe, headers=auth(KEY_ACME))
    used_after_probe = used + after.json()["usage"]["total_tokens"]
    bound = len(json.dumps(probe, separators=(",", ":"))) + 16 + 64 + 1
    assert 3000 - used - bound - 40 <= remaining(after) <= 3000 - used
    big = httpx.post(url, json=chat(max_tokens=remaining(after)), headers=auth(KEY_ACME))
    assert big.status_code == 429
    error = big.json()["error"]
    assert error["code"] == "token_budget_exceeded" and error["budget"]["per"] == "hour"
    assert 1 <= int(big.headers["retry-after"]) <= 3600
    assert big.headers["x-ratelimit-limit-tokens"] == "3000"
    assert int(big.headers["x-ratelimit-remaining-tokens"]) >= 3000 - used_after_probe - 120
    too_big = httpx.post(url, json=chat(max_tokens=5000), headers=auth(KEY_ACME))
    assert too_big.status_code == 400
    assert too_big.json()["error"]["code"] == "request_exceeds_budget"


def _usage(r: RunnerProcess, key: str, **params: str) -> httpx.Response:
    return httpx.get(r.url + "/v1/usage", params=params, headers=auth(key), timeout=10)


def test_tenant_policy_usage_rows_per_tenant(r: RunnerProcess) -> None:
    """Usage counts each tenant's requests by outcome and the engine's tokens; a tenant
    reads only its own, an admin everyone's."""
    url = r.url + "/v1/chat/completions"
    answers = [httpx.post(url, json=chat(max_tokens=3), headers=auth(KEY_OPS)) for _ in range(2)]
    httpx.post(url, json=chat("secret"), headers=auth(KEY_ACME))  # 403: refused
    mine = _usage(r, KEY_OPS, tenant="ops").json()["data"]
    (row,) = [x for x in mine if x["model"] == "echo"]
    assert row["requests"] == 2 and row["requestsByOutcome"]["ok"] == 2
    assert row["promptTokens"] == sum(a.json()["usage"]["prompt_tokens"] for a in answers)
    assert row["completionTokens"] == sum(a.json()["usage"]["completion_tokens"] for a in answers)
    everyone = {x["tenant"] for x in _usage(r, KEY_OPS).json()["data"]}
    assert {"ops", "acme"} <= everyone
    own = _usage(r, KEY_ACME).json()["data"]
    assert {x["tenant"] for x in own} == {"acme"}
    assert _usage(r, KEY_ACME, tenant="ops").status_code == 403
    by_day = _usage(r, KEY_OPS, group_by="day").json()
    assert by_day["groupBy"] == "day" and by_day["data"][0]["start"].endswith("T00:00:00Z")


def _put(r: RunnerProcess, tenant: str, policy: dict[str, Any] | None) -> httpx.Response:
    sha = policy_sha256(policy)
    token = dev_token("tenant-policy", None, {"tenantId": tenant, "policySha256": sha})
    if policy is None:
        return httpx.request("DELETE", f"{r.url}/v1/tenants/{tenant}",
                             json={"verifiedOpToken": token})  # fmt: skip
    return httpx.put(
        f"{r.url}/v1/tenants/{tenant}", json={"policy": policy, "verifiedOpToken": token}
    )


def test_tenant_policy_change_and_key_rotation_live(r: RunnerProcess) -> None:
    """A governed PUT changes the policy without a restart: the new key works at once and
    the old one is refused at once; the list shows the version and who approved; a token
    for another policy is refused (403) and nothing changes; DELETE removes the tenant."""
    url = r.url + "/v1/chat/completions"
    policy = {"api_keys": [digest(KEY_NEW)], "models": ["echo", "secret"],
              "priority": {"default": "normal", "max": "high"}}  # fmt: skip
    token = dev_token("tenant-policy", None, {"tenantId": "acme", "policySha256": "0" * 64})
    wrong = httpx.put(f"{r.url}/v1/tenants/acme", json={"policy": policy, "verifiedOpToken": token})
    assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "binding_mismatch"
    assert httpx.post(url, json=chat(max_tokens=4), headers=auth(KEY_ACME)).status_code == 200
    changed = _put(r, "acme", policy)
    assert changed.status_code == 200, changed.text
    assert changed.json()["approvedBy"] == ["admin1", "admin2"]
    assert httpx.post(url, json=chat("secret"), headers=auth(KEY_NEW)).status_code == 200
    assert httpx.post(url, json=chat(), headers=auth(KEY_ACME)).status_code == 401
    listed = httpx.get(r.url + "/v1/tenants", headers=auth(KEY_OPS)).json()
    (acme,) = [t for t in listed["tenants"] if t["tenantId"] == "acme"]
    assert acme["source"] == "api" and acme["version"] == changed.json()["version"]
    assert acme["policySha256"] == policy_sha256(policy)
    assert httpx.get(r.url + "/v1/tenants", headers=auth(KEY_NEW)).status_code == 403
    assert _put(r, "acme", None).status_code == 200
    assert httpx.post(url, json=chat(), headers=auth(KEY_NEW)).status_code == 401


def test_tenant_policy_sighup_rereads_the_file(tmp_path: Path) -> None:
    """Embedded: SIGHUP re-reads the tenants file; a tenant's new limits apply at once."""
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  acme:\n    models: [echo]\n")
    with (
        start_fake("fake_openai", "--latency-ms", "0") as echo,
        start_runner({"echo": echo.url, "other": echo.url}, env={"TENANTS_FILE": str(path)}) as r,
    ):
        url = r.url + "/v1/chat/completions"
        head = {"X-Tenant-ID": "acme"}
        assert httpx.post(url, json=chat("other"), headers=head).status_code == 403
        path.write_text("tenants:\n  acme:\n    models: [echo, other]\n")
        r.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        eventually(lambda: httpx.post(url, json=chat("other"), headers=head).status_code == 200)
        assert time.monotonic() < deadline


def _raw(r: RunnerProcess, body: dict[str, Any], key: str = KEY_ACME) -> tuple[bytes, int]:
    """The body's exact bytes and its prompt bound (runner/tenancy/guard.py)."""
    raw = json.dumps(body).encode()
    return raw, len(raw) + 16 * len(body["messages"]) + 64


def _acme_rows(r: RunnerProcess) -> dict[str, dict[str, Any]]:
    rows = _usage(r, KEY_OPS, tenant="acme").json()["data"]
    return {row["model"]: row for row in rows}


def test_tenant_policy_cut_short_and_failed_requests_pay_what_they_used(
    r: RunnerProcess,
) -> None:
    """A cancelled stream pays its prompt and what was generated (the chunks read plus the
    documented allowance), not its reservation; a stream the engine broke pays the same
    way; a whole answer that never came pays its bounds; the budget's counter is exactly
    what usage shows (one figure for both)."""
    url = r.url + "/v1/chat/completions"
    head = {**auth(KEY_ACME), "Content-Type": "application/json"}
    slow = chat("echo-slow", max_tokens=100, stream=True)
    raw, slow_bound = _raw(r, slow)
    with httpx.stream("POST", url, content=raw, headers=head, timeout=30) as streamed:
        assert streamed.status_code == 200
        seen = 0
        for line in streamed.iter_lines():
            seen += '"content":"' in line
            if seen == 3:
                break  # the client goes away after 3 tokens
    eventually(lambda: _acme_rows(r).get("echo-slow", {}).get("requests") == 1)
    row = _acme_rows(r)["echo-slow"]
    assert row["requestsByOutcome"]["cancelled"] == 1
    assert row["promptTokens"] == slow_bound  # the fake gives no prompt length: its bound
    assert 3 + 8 <= row["completionTokens"] < 100  # what was made, not max_tokens

    broken = chat("echo-dies", max_tokens=50, stream=True)
    raw, broken_bound = _raw(r, broken)
    answer = httpx.post(url, content=raw, headers=head, timeout=30)
    assert answer.status_code == 200 and '"engine_unavailable"' in answer.text
    whole = chat("echo-dies", max_tokens=5)
    raw, whole_bound = _raw(r, whole)
    assert httpx.post(url, content=raw, headers=head, timeout=30).status_code == 502
    eventually(lambda: _acme_rows(r).get("echo-dies", {}).get("requests") == 2)
    dies = _acme_rows(r)["echo-dies"]
    assert dies["requestsByOutcome"]["failed"] == 2
    assert dies["promptTokens"] == broken_bound + whole_bound
    assert dies["completionTokens"] == (3 + 8) + 5  # 3 chunks read + allowance; the bound

    charged = sum(x["promptTokens"] + x["completionTokens"] for x in _acme_rows(r).values())
    probe = chat(max_tokens=1)
    raw, probe_bound = _raw(r, probe)
    after = httpx.post(url, content=raw, headers=head, timeout=30)
    assert remaining(after) == 3000 - charged - (probe_bound + 1)

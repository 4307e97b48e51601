"""Governed adapter loads and unloads, refused through HTTP before a token is spent, and the
adapter entitlement, on a runner whose models need no real engine (the real ones:
tests/runner/lifecycle/test_adapter_ops_llama_real.py and test_adapter_ops_vllm_real.py)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.launch import start_fake
from tests.support.runner_proc import RunnerProcess, fixture_bin, start_runner
from tests.support.tokens import DEV_AUDIT_KEY, DEV_REGISTRY, dev_token

pytestmark = pytest.mark.timeout(60)


class Rig:
    def __init__(self, runner: RunnerProcess, audit: Path, adapter: Path) -> None:
        self.runner, self.audit, self.adapter = runner, audit, adapter

    def audited(self) -> list[dict[str, Any]]:
        if not self.audit.exists():
            return []
        return [json.loads(line) for line in self.audit.read_text().splitlines()]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    audit = tmp_path / "audit.jsonl"
    folder = tmp_path / "adapters"
    folder.mkdir()
    adapter = folder / "a.gguf"
    adapter.write_bytes(b"GGUF adapter stand-in")
    models = f"""models:
  - id: base
    backend: llama-server
    path: {tmp_path}/base.gguf
    adapters:
      - {{name: own, path: {adapter}, tenants: [team-a, team-x]}}
  - id: echo
    backend: openai
    url: ECHO
"""
    with ExitStack() as stack:
        echo = stack.enter_context(start_fake("fake_openai", "--latency-ms", "0"))
        tenants = tmp_path / "tenants.yaml"
        tenants.write_text(
            "tenants:\n  team-a: {models: ['base:own']}\n  team-x: {models: [echo, base]}\n"
        )
        env = {
            "TENANTS_FILE": str(tenants),
            "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
            "GOVERNANCE_AUDIT_LOG": str(audit),
            "GOVERNANCE_AUDIT_KEY": str(DEV_AUDIT_KEY),
            "LLAMA_SERVER_BIN": fixture_bin("llama-server-ok"),
        }
        runner = stack.enter_context(
            start_runner(models_file=models.replace("ECHO", echo.url), env=env)
        )
        yield Rig(runner, audit, adapter)


def _adapters_seen(rig: Rig, tenant: str | None) -> list[dict[str, Any]]:
    """The adapters capabilities list to `tenant` (None: a caller naming nobody)."""
    headers = {"X-Tenant-ID": tenant} if tenant else {}
    caps = httpx.get(rig.runner.url + "/v1/capabilities", headers=headers).json()
    adapters: list[dict[str, Any]] = caps.get("adapters", [])
    return adapters


def _load(rig: Rig, **fields: Any) -> httpx.Response:
    body = {
        "adapterId": "base:new",
        "baseModel": "base",
        "path": str(rig.adapter),
        "sha256": hashlib.sha256(rig.adapter.read_bytes()).hexdigest(),
        "tenants": ["team-b"],
        **fields,
    }
    body = {k: v for k, v in body.items() if v is not None}
    params = {k: v for k, v in body.items() if k != "adapterId"}
    token = dev_token("adapter-load", body.get("adapterId"), params)
    return httpx.post(rig.runner.url + "/v1/adapters/load", json={**body, "verifiedOpToken": token})


@pytest.mark.parametrize(
    ("fields", "status", "says"),
    [
        ({"extra": 1}, 400, "unknown field"),
        ({"tenants": []}, 400, "tenants"),
        ({"sha256": "ab"}, 400, "sha256"),
    ],
)
def test_adapter_load_malformed_is_refused_before_a_token_is_spent(
    rig: Rig, fields: dict[str, Any], status: int, says: str
) -> None:
    """A body that cannot be an adapter load (its syntax alone) is refused with a clear 4xx
    before governance sees the token: no nonce is spent, and the refusal is audited as
    rejected, with the caller's address and nothing of its body."""
    r = _load(rig, **fields)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]["message"]
    (record,) = rig.audited()
    assert (record["outcome"], record["reason"]) == ("rejected", "invalid_request")
    assert record["nonce_sha256"] is None
    assert record["params"] == {} and record["extra"]["source"] == "127.0.0.1"


@pytest.mark.parametrize(
    ("fields", "status", "says"),
    [
        ({"sha256": "0" * 64}, 400, "sha256"),
        ({"path": "a\u0000b"}, 400, "cannot be read"),  # schemathesis found a 500
        ({"path": "/etc/hostname"}, 400, "inside the model roots"),
        ({"path": "~no-such-user-q7/a.gguf"}, 400, "inside the model roots"),  # schemathesis: 500
        ({"baseModel": "nope"}, 404, "nope"),
        ({"baseModel": "echo"}, 400, "cannot serve adapters"),
        ({"adapterId": "base:own"}, 409, "already taken"),
        ({"adapterId": "echo"}, 409, "already taken"),
    ],
)
def test_adapter_load_naming_what_is_not_there_is_refused_only_after_approval(
    rig: Rig, fields: dict[str, Any], status: int, says: str
) -> None:
    """Which models, adapters and files exist is told only to a caller with a valid token
    (docs/security.md): a well-formed load naming an unknown base, a base that takes no
    adapters, a taken id or a file with another sha256 is approved (audited, its nonce
    spent) and then refused with the specific 4xx; nothing is loaded."""
    r = _load(rig, **fields)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]["message"]
    (record,) = rig.audited()
    assert record["operation"] == "adapter-load"
    assert [a["id"] for a in _adapters_seen(rig, "team-a")] == ["base:own"]
    assert _adapters_seen(rig, "team-b") == []  # nothing loaded for team-b


def test_adapter_load_naming_an_unknown_base_without_a_token_tells_nothing(rig: Rig) -> None:
    """Without a valid token, a load naming a base that does not exist gets the gate's
    refusal, the same as one naming a base that does: existence is not revealed."""

    def post(base: str) -> httpx.Response:
        body = {
            "adapterId": "x:new",
            "baseModel": base,
            "path": str(rig.adapter),
            "sha256": "0" * 64,
            "tenants": ["team-b"],
        }
        token = dev_token("adapter-load", "x:new", {**body, "tenants": ["*"]})
        return httpx.post(
            rig.runner.url + "/v1/adapters/load", json={**body, "verifiedOpToken": token}
        )

    unknown, known = post("nope"), post("base")
    assert unknown.status_code == known.status_code == 403, unknown.text
    assert unknown.json()["error"]["code"] == known.json()["error"]["code"] == "binding_mismatch"


def test_adapter_load_with_a_token_for_other_params_is_403_and_audited(rig: Rig) -> None:
    """A token approving other tenants than the body lists is a binding mismatch (403),
    audited as rejected; nothing is loaded."""
    body = {
        "adapterId": "base:new",
        "baseModel": "base",
        "path": str(rig.adapter),
        "sha256": hashlib.sha256(rig.adapter.read_bytes()).hexdigest(),
        "tenants": ["team-b"],
    }
    params = {k: v for k, v in body.items() if k != "adapterId"}
    token = dev_token("adapter-load", "base:new", {**params, "tenants": ["*"]})
    r = httpx.post(rig.runner.url + "/v1/adapters/load", json={**body, "verifiedOpToken": token})
    assert r.status_code == 403 and r.json()["error"]["code"] == "binding_mismatch"
    (record,) = rig.audited()
    assert (record["operation"], record["outcome"]) == ("adapter-load", "rejected")
    assert [a["id"] for a in _adapters_seen(rig, "team-a")] == ["base:own"]
    assert _adapters_seen(rig, "team-b") == []  # nothing loaded for team-b


def test_adapter_load_onto_a_base_not_running_joins_its_set(rig: Rig) -> None:
    """Approved while its base has no engine, an adapter joins the base's set (loaded with
    it) and reads `available`; unloaded again, it is gone."""
    r = _load(rig)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "available" and r.json()["governed"] is True
    seen = {a["id"]: a["state"] for t in ("team-a", "team-b") for a in _adapters_seen(rig, t)}
    assert seen == {"base:own": "available", "base:new": "available"}
    caps = httpx.get(rig.runner.url + "/v1/capabilities", headers={"X-Tenant-ID": "team-b"})
    assert "base:new" in caps.json()["models"]["available"]
    assert _adapters_seen(rig, None) == []  # to a caller naming nobody: none (bound ones)
    body = {"adapterId": "base:new", "baseModel": "base", "sha256": r.json()["sha256"]}
    token = dev_token(
        "adapter-unload", "base:new", {k: v for k, v in body.items() if k != "adapterId"}
    )
    r = httpx.post(rig.runner.url + "/v1/adapters/unload", json={**body, "verifiedOpToken": token})
    assert r.status_code == 200 and r.json()["unloaded"] is True
    assert [(a["operation"], a["outcome"]) for a in rig.audited()] == [
        ("adapter-load", "approved"),
        ("adapter-unload", "approved"),
    ]


def test_adapter_entitlement_is_checked_before_the_model(rig: Rig) -> None:
    """A tenant not bound to an adapter gets what any unknown model gets (404, the same
    answer as for an id no adapter has) whatever state its base is in; a bound one gets
    what the base's state gives (404 model_not_loaded here)."""
    chat = {"model": "base:own", "messages": [{"role": "user", "content": "hi"}]}
    url = rig.runner.url + "/v1/chat/completions"
    r = httpx.post(url, json=chat, headers={"X-Tenant-ID": "team-b"})
    missing = httpx.post(
        url, json={**chat, "model": "base:none"}, headers={"X-Tenant-ID": "team-b"}
    )
    assert r.status_code == missing.status_code == 404, r.text
    assert r.json()["error"]["code"] == missing.json()["error"]["code"] == "model_not_found"
    assert (
        r.json()["error"]["message"].replace("base:own", "base:none")
        == (missing.json()["error"]["message"])
    )
    r = httpx.post(
        url, json={**chat, "lora": [{"id": 0, "scale": 1}]}, headers={"X-Tenant-ID": "team-a"}
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_loaded"


def test_adapter_needs_both_its_binding_and_the_tenants_models_policy(rig: Rig) -> None:
    """An adapter's id goes through the tenant's `models` entitlement like any model id: a
    tenant bound to the adapter but whose policy lists only other models (its base
    included) is refused 403; a tenant whose policy lists the adapter's id alone, not its
    base, gets past both (here to the base's state: 404 model_not_loaded)."""
    chat = {"model": "base:own", "messages": [{"role": "user", "content": "hi"}]}
    url = rig.runner.url + "/v1/chat/completions"
    r = httpx.post(url, json=chat, headers={"X-Tenant-ID": "team-x"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed"
    assert "echo" in r.json()["error"]["message"]
    r = httpx.post(url, json=chat, headers={"X-Tenant-ID": "team-a"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_loaded"
    listed = httpx.get(rig.runner.url + "/v1/capabilities", headers={"X-Tenant-ID": "team-x"})
    assert listed.json().get("adapters", []) == []  # asked as team-x: not its adapter

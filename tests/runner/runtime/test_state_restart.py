"""State that survives a restart in embedded mode (no Redis): a runner process stopped by
SIGTERM or killed by SIGKILL, started again on the same `STATE_DB`, still refuses a spent
lifecycle token, still applies a governed tenant policy and still refuses a revoked key."""

from __future__ import annotations

import hashlib
import signal
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from governance.encoding import policy_sha256
from tests.fixtures.launch import FakeEngine, start_fake
from tests.support.runner_proc import RunnerProcess, start_runner
from tests.support.tokens import DEV_REGISTRY, dev_token

pytestmark = pytest.mark.timeout(120)

KEY_OPS = "ops-key-0123456789abcdef0123456789abcd"
KEY_ACME = "acme-key-0123456789abcdef0123456789abc"
KEY_NEW = "acme-key-rotated-99-0123456789abcdef012"
KEY_GLOBEX = "globex-key-0123456789abcdef0123456789"
STOPS = [pytest.param(signal.SIGTERM, id="sigterm"), pytest.param(signal.SIGKILL, id="sigkill")]


def digest(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


TENANTS = f"""
tenants:
  ops:
    api_keys: ["{digest(KEY_OPS)}"]
  acme:
    api_keys: ["{digest(KEY_ACME)}"]
    models: ["echo"]
  globex:
    api_keys: ["{digest(KEY_GLOBEX)}"]
"""


class Restarts:
    """One fake engine and the settings of a runner that a test stops and starts again."""

    def __init__(self, tmp: Path, engine: FakeEngine) -> None:
        tenants = tmp / "tenants.yaml"
        tenants.write_text(TENANTS)
        self.models = {"echo": engine.url, "other": engine.url}
        self.env = {
            "TENANTS_FILE": str(tenants),
            "ADMIN_TENANTS": "ops",
            "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
            "USAGE_DB": str(tmp / "usage.sqlite3"),  # STATE_DB's default is beside it
        }

    @contextmanager
    def runner(self) -> Iterator[RunnerProcess]:
        with start_runner(self.models, env=self.env) as runner:
            yield runner


@pytest.fixture
def restarts(tmp_path: Path) -> Iterator[Restarts]:
    with ExitStack() as stack:
        engine = stack.enter_context(start_fake("fake_openai", "--latency-ms", "0"))
        yield Restarts(tmp_path, engine)


def stop(runner: RunnerProcess, how: signal.Signals) -> None:
    runner.proc.send_signal(how)
    runner.proc.wait(30)


def flush(runner: RunnerProcess, token: dict[str, Any]) -> httpx.Response:
    body = {"scope": "all", "verifiedOpToken": token}
    return httpx.post(runner.url + "/v1/cache/flush", json=body, timeout=20)


def put(runner: RunnerProcess, tenant: str, policy: dict[str, Any] | None) -> httpx.Response:
    token = dev_token(
        "tenant-policy", None, {"tenantId": tenant, "policySha256": policy_sha256(policy)}
    )
    url = f"{runner.url}/v1/tenants/{tenant}"
    if policy is None:
        return httpx.request("DELETE", url, json={"verifiedOpToken": token}, timeout=20)
    return httpx.put(url, json={"policy": policy, "verifiedOpToken": token}, timeout=20)


def chat(runner: RunnerProcess, key: str, model: str = "echo") -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {key}"}
    url = runner.url + "/v1/chat/completions"
    return httpx.post(url, json=body, headers=headers, timeout=20).status_code


@pytest.mark.parametrize("how", STOPS)
def test_state_restart_spent_token_stays_spent(restarts: Restarts, how: signal.Signals) -> None:
    """A cache-flush token answered 200 then 409 is still 409 after the runner restarts."""
    token = dev_token("cache-flush", None, {"scope": "all"})
    with restarts.runner() as first:
        assert flush(first, token).status_code == 200
        assert flush(first, token).status_code == 409
        stop(first, how)
    with restarts.runner() as second:
        replay = flush(second, token)
        assert replay.status_code == 409, replay.text
        assert replay.json()["error"]["code"] == "nonce_replayed"
        assert flush(second, dev_token("cache-flush", None, {"scope": "all"})).status_code == 200


@pytest.mark.parametrize("how", STOPS)
def test_state_restart_governed_policy_stays(restarts: Restarts, how: signal.Signals) -> None:
    """A governed policy change (a model allowed) is still in force after a restart, and
    the token that made it is still spent."""
    policy = {"api_keys": [digest(KEY_ACME)], "models": ["echo", "other"]}
    with restarts.runner() as first:
        assert chat(first, KEY_ACME, "other") == 403
        changed = put(first, "acme", policy)
        assert changed.status_code == 200, changed.text
        assert chat(first, KEY_ACME, "other") == 200
        stop(first, how)
    with restarts.runner() as second:
        assert chat(second, KEY_ACME, "other") == 200
        listed = httpx.get(
            second.url + "/v1/tenants", headers={"Authorization": f"Bearer {KEY_OPS}"}
        )
        (acme,) = [t for t in listed.json()["tenants"] if t["tenantId"] == "acme"]
        assert acme["source"] == "api" and acme["version"] == changed.json()["version"]


@pytest.mark.parametrize("how", STOPS)
def test_state_restart_revoked_keys_stay_revoked(restarts: Restarts, how: signal.Signals) -> None:
    """A key rotated away by PUT and a tenant removed by DELETE stay refused (401) after a
    restart, although the tenants file still holds their keys; the new key still works."""
    rotated = {"api_keys": [digest(KEY_NEW)], "models": ["echo"]}
    with restarts.runner() as first:
        assert put(first, "acme", rotated).status_code == 200
        assert put(first, "globex", None).status_code == 200
        assert chat(first, KEY_ACME) == 401 and chat(first, KEY_GLOBEX) == 401
        stop(first, how)
    with restarts.runner() as second:
        assert chat(second, KEY_ACME) == 401
        assert chat(second, KEY_GLOBEX) == 401
        assert chat(second, KEY_NEW) == 200

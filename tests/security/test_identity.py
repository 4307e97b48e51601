"""Identity by assertion (issue 25, Why 2): who a request is must be decided by something
the sender cannot simply claim, in every path that asks (inference, jobs, engine logs, the
status page), and failed attempts to prove it must cost the attacker time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.security.kit import (
    KEYS,
    basic,
    bearer,
    chat,
    keyed_runner,
    stand_in_models,
    start_refused,
    tenants_file,
    wait_loaded,
)
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(120)

FAIRNESS = "x-llm-d-inference-fairness-id"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerProcess]:
    """A runner behind a gateway: the tenant is the gateway's fairness id; `ops` is admin."""
    env = {"TENANT_IDENTITY": "gateway", "ADMIN_TENANTS": "ops", "GATEWAY_PEERS": "127.0.0.1"}
    with start_runner(models_file=stand_in_models(), env=env) as r:
        wait_loaded(r)
        yield r


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerProcess]:
    """A runner in keys mode; failures throttled at 5 per source, 3 per claimed tenant."""
    env = {
        "AUTH_FAILURE_SOURCE_LIMIT": "5/minute",
        "AUTH_FAILURE_TENANT_LIMIT": "3/minute",
    }
    with keyed_runner(tmp_path_factory.mktemp("keyed"), env) as r:
        yield r


def test_open_mode_with_admin_tenants_refuses_to_start() -> None:
    """Attack: with no keys, anyone sends `X-Tenant-ID: ops` and reads the status page and
    engine logs of an ADMIN_TENANTS runner. The runner refuses to start that way."""
    code, log = start_refused({"ADMIN_TENANTS": "ops"})
    assert code == 2, log
    assert "ADMIN_TENANTS" in log and "TENANT_IDENTITY" in log


def test_multi_tenant_off_with_keys_refuses_to_start(tmp_path: Path) -> None:
    """Attack: ENABLE_MULTI_TENANT=false beside a keyed tenants file silently stopped
    checking keys for inference. That configuration no longer starts."""
    env = {"ENABLE_MULTI_TENANT": "false", "TENANTS_FILE": str(tenants_file(tmp_path / "t.yaml"))}
    code, log = start_refused(env)
    assert code == 2, log
    assert "ENABLE_MULTI_TENANT" in log


def test_short_api_key_refuses_to_start(tmp_path: Path) -> None:
    """Attack: a guessable key (any length was accepted) is brute-forced. Plain keys
    shorter than the minimum stop start-up, naming the tenant."""
    path = tmp_path / "t.yaml"
    path.write_text("tenants:\n  acme:\n    api_keys: ['hunter2']\n")
    code, log = start_refused({"TENANTS_FILE": str(path)})
    assert code == 2, log
    assert "acme" in log and "32" in log


def test_gateway_mode_takes_the_tenant_only_from_the_gateway(gateway: RunnerProcess) -> None:
    """Attack: behind the Inference Gateway a client sends `X-Tenant-ID: <victim>` to spend
    the victim's share and hit its cache salt. In gateway mode the tenant is the fairness
    id alone: none is 401 missing_gateway_identity, a disagreeing X-Tenant-ID is 403."""
    none = chat(gateway.url, {"X-Tenant-ID": "victim"})
    assert none.status_code == 401, none.text
    assert none.json()["error"]["code"] == "missing_gateway_identity"
    mismatch = chat(gateway.url, {"X-Tenant-ID": "victim", FAIRNESS: "attacker"})
    assert mismatch.status_code == 403 and mismatch.json()["error"]["code"] == "tenant_mismatch"
    ok = chat(gateway.url, {FAIRNESS: "victim", "X-Tenant-ID": "victim"})
    assert ok.status_code == 200, ok.text


def test_one_identity_for_every_path(gateway: RunnerProcess) -> None:
    """Attack: the admin-only paths read X-Tenant-ID where inference did not (engine logs,
    the status page, jobs). Every path identifies alike: `X-Tenant-ID: ops` alone is 401
    everywhere; the gateway's `ops` reads the admin pages."""
    claimed = {"X-Tenant-ID": "ops"}
    for path in ("/ui/state.json", "/v1/models/m/logs", "/v1/jobs/job_0123456789abcdef"):
        r = httpx.get(gateway.url + path, headers=claimed)
        assert r.status_code == 401, (path, r.status_code, r.text)
        assert r.json()["error"]["code"] == "missing_gateway_identity", path
    for path in ("/ui/state.json", "/v1/models/m/logs"):
        assert httpx.get(gateway.url + path, headers={FAIRNESS: "ops"}).status_code == 200, path


def test_identity_mode_is_shown_in_capabilities(
    gateway: RunnerProcess, keyed: RunnerProcess
) -> None:
    """Operators and routers can see how a runner decides who a request is."""
    assert httpx.get(gateway.url + "/v1/capabilities").json()["identity"] == "gateway"
    assert httpx.get(keyed.url + "/v1/capabilities").json()["identity"] == "keys"


def test_gateway_mode_trusts_only_listed_peers_and_the_shared_secret() -> None:
    """Attack: a client that reaches a runner directly (not through the gateway) sets the
    fairness id itself. With GATEWAY_PEERS or GATEWAY_SECRET, only the gateway is heard:
    403 untrusted_gateway otherwise."""
    env = {"TENANT_IDENTITY": "gateway", "GATEWAY_PEERS": "10.0.0.0/8"}
    with start_runner(models_file=stand_in_models(), env=env) as r:
        wait_loaded(r)
        refused = chat(r.url, {FAIRNESS: "acme"})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "untrusted_gateway"
    env = {"TENANT_IDENTITY": "gateway", "GATEWAY_SECRET": "s3cret-shared-with-the-gateway-0123"}
    with start_runner(models_file=stand_in_models(), env=env) as r:
        wait_loaded(r)
        for secret in (None, "wrong"):
            headers = {FAIRNESS: "acme"} | ({"X-Quorum-Gateway-Secret": secret} if secret else {})
            refused = chat(r.url, headers)
            assert refused.status_code == 403, refused.text
        ok = chat(r.url, {FAIRNESS: "acme", "X-Quorum-Gateway-Secret": env["GATEWAY_SECRET"]})
        assert ok.status_code == 200, ok.text


def test_failed_authentications_are_throttled_per_source(tmp_path: Path) -> None:
    """Attack: guessing API keys as fast as the runner answers. After the source's quota of
    failures, every wrong key from it is 429 with Retry-After; the right key is still
    served (it is checked before the throttle decides)."""
    env = {"AUTH_FAILURE_SOURCE_LIMIT": "5/minute", "AUTH_FAILURE_TENANT_LIMIT": "100/minute"}
    with keyed_runner(tmp_path, env) as r:
        for n in range(5):
            r401 = chat(r.url, {"Authorization": f"Bearer guess-{n:040d}"})
            assert r401.status_code == 401, r401.text
        throttled = chat(r.url, {"Authorization": "Bearer guess-again-0000000000000000000000000"})
        assert throttled.status_code == 429, throttled.text
        assert throttled.json()["error"]["code"] == "too_many_auth_failures"
        assert int(throttled.headers["retry-after"]) >= 1
        assert chat(r.url, bearer("acme")).status_code == 200


def test_failed_authentications_are_throttled_per_tenant(keyed: RunnerProcess) -> None:
    """Attack: a source guesses one tenant's key. Failures that name a tenant count for
    (tenant, source): past that quota, wrong keys naming it from there are 429; other
    tenants are untouched (and the tenant itself is never locked out: test_ajar.py)."""
    for n in range(3):
        r = chat(keyed.url, {"X-Tenant-ID": "globex", "Authorization": f"Bearer g{n:040d}"})
        assert r.status_code == 401, r.text
    throttled = chat(keyed.url, {"X-Tenant-ID": "globex", "Authorization": "Bearer " + "x" * 40})
    assert throttled.status_code == 429 and "retry-after" in throttled.headers
    assert chat(keyed.url, bearer("acme")).status_code == 200


def test_status_page_sign_in_is_throttled(tmp_path: Path) -> None:
    """Attack: guessing the admin's key through the status page's Basic sign-in. Failed
    sign-ins are throttled like bearer keys: 429 with Retry-After."""
    env = {"AUTH_FAILURE_SOURCE_LIMIT": "100/minute", "AUTH_FAILURE_TENANT_LIMIT": "4/minute"}
    with keyed_runner(tmp_path, env) as r:
        for n in range(4):
            assert (
                httpx.get(r.url + "/ui", headers=basic("ops", f"guess{n:035d}")).status_code == 401
            )
        throttled = httpx.get(r.url + "/ui", headers=basic("ops", "y" * 40))
        assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) >= 1
        ok = httpx.get(r.url + "/ui", headers=basic("acme", KEYS["acme"]))
        assert ok.status_code == 403  # acme signs in (not throttled), and is no admin

"""`quorum usage` and `quorum tenant set|show|delete`, run as an operator runs them: on a
pseudo-terminal (tables) and with --json / --csv, against a real runner process (its
tenants file, governance with the dev registry) in front of the fake OpenAI engine."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from governance.encoding import policy_sha256
from tests.client.test_cli import QUORUM, plain, pty, run_json
from tests.fixtures.launch import start_fake
from tests.support.runner_proc import REPO_ROOT, RunnerProcess, start_runner
from tests.support.tokens import DEV_REGISTRY, dev_token

pytestmark = pytest.mark.timeout(120)

RID = "cli-tenants"
KEYS = {
    "ops": "ops-cli-key-0123456789abcdef012345678",
    "acme": "acme-cli-key-0123456789abcdef01234567",
}
DIGEST = {t: "sha256:" + hashlib.sha256(k.encode()).hexdigest() for t, k in KEYS.items()}
TENANTS = f"""
tenants:
  ops: {{api_keys: ["{DIGEST["ops"]}"]}}
  acme:
    models: ["echo"]
    token_budgets: [{{tokens: 5000, per: hour}}]
    api_keys: ["{DIGEST["acme"]}"]
"""


@pytest.fixture
def r(tmp_path: Path) -> Iterator[RunnerProcess]:
    """A runner whose admin is `ops`; acme may use `echo` only, with an hourly budget; both
    identified by their API keys (an admin needs keys or a gateway)."""
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    env = {
        "TENANTS_FILE": str(path),
        "ADMIN_TENANTS": "ops",
        "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
        "RUNNER_ID": RID,
        "USAGE_DB": str(tmp_path / "usage.sqlite3"),
    }
    with (
        start_fake("fake_openai", "--latency-ms", "0") as echo,
        start_runner({"echo": echo.url, "other": echo.url}, env=env) as runner,
    ):
        yield runner


def chat(r: RunnerProcess, tenant: str, model: str = "echo") -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3}
    return httpx.post(
        r.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEYS[tenant]}"},
        timeout=30,
    )


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [QUORUM, *args], capture_output=True, text=True, timeout=90, cwd=REPO_ROOT
    )


def test_cli_usage_table_json_and_csv(r: RunnerProcess) -> None:
    """`quorum usage` shows one row per tenant and model with the engine's tokens (table on
    a terminal, --json the API's document, --csv a header and a line per row); a tenant
    that is not an admin sees its own rows only and is refused another's (exit 1)."""
    answers = [chat(r, "ops"), chat(r, "ops"), chat(r, "acme")]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert chat(r, "acme", "other").status_code == 403  # refused: counted, no tokens
    prompt = sum(a.json()["usage"]["prompt_tokens"] for a in answers[:2])
    output = sum(a.json()["usage"]["completion_tokens"] for a in answers[:2])

    screen = plain(pty("usage", "--url", r.url, "--api-key", KEYS["ops"]))
    assert "usage by hour" in screen and "outcomes: ok/cancelled/refused/failed" in screen
    assert f"│ ops │ echo │ 2 │ 2/0/0/0 │ {prompt} │ {output} │ 0 │" in screen
    assert "│ acme │ _unknown │ 1 │ 0/0/1/0 │ 0 │ 0 │ 0 │" in screen  # never a label it chose

    code, doc = run_json("usage", "--url", r.url, "--api-key", KEYS["ops"], "--tenant-id", "ops")
    assert code == 0 and doc["groupBy"] == "hour"
    (row,) = doc["data"]
    assert (row["tenant"], row["model"], row["requests"]) == ("ops", "echo", 2)
    assert (row["promptTokens"], row["completionTokens"]) == (prompt, output)

    done = run("usage", "--url", r.url, "--api-key", KEYS["acme"], "--csv", "--group-by", "day")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert {(x["tenant"], x["model"]) for x in rows} == {("acme", "echo"), ("acme", "_unknown")}
    assert all(x["start"].endswith("T00:00:00Z") for x in rows)
    (refused,) = [x for x in rows if x["model"] == "_unknown"]
    assert refused["requests_refused"] == "1" and refused["promptTokens"] == "0"

    denied = run("usage", "--url", r.url, "--api-key", KEYS["acme"], "--tenant-id", "ops")
    assert denied.returncode == 1 and "403 forbidden" in denied.stderr


def _policy_file(tmp_path: Path) -> str:
    """POLICY as an operator writes it: a YAML file."""
    path = tmp_path / "acme.yaml"
    path.write_text(
        "models: [echo, other]\npriority: {default: normal, max: high}\nmax_in_flight: 2\n"
        f"api_keys: ['{DIGEST['acme']}']\n"  # the policy replaces the file's: the key stays
    )
    return str(path)


def _token_file(tmp_path: Path, name: str, tenant: str, policy: object) -> str:
    """A tenant-policy token approving exactly `policy` for `tenant`."""
    params = {"tenantId": tenant, "policySha256": policy_sha256(policy)}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(dev_token("tenant-policy", None, params, aud=RID)))
    return str(path)


POLICY = {
    "models": ["echo", "other"],
    "priority": {"default": "normal", "max": "high"},
    "max_in_flight": 2,
    "api_keys": [DIGEST["acme"]],
}


def test_cli_tenant_set_show_and_delete(r: RunnerProcess, tmp_path: Path) -> None:
    """`quorum tenant set` sends the policy file with its token (the new policy applies at
    once), `show` lists it with its version and who approved it (table and --json), a
    token for another policy or tenant is refused before anything is sent (exit 2),
    `delete` removes the tenant (its file entry too: the list shows it deleted)."""
    policy_file, token = _policy_file(tmp_path), _token_file(tmp_path, "ok", "acme", POLICY)
    for name, tenant, policy, why in (
        ("wider", "acme", {"models": ["*"]}, "approves another policy than this one"),
        ("globex", "globex", POLICY, "approves a policy for 'globex'"),
    ):
        wrong = _token_file(tmp_path, name, tenant, policy)
        code, doc = run_json("tenant", "set", "acme", "--policy", policy_file, "--token", wrong,
                             "--url", r.url)  # fmt: skip
        assert code == 2 and why in doc["error"]
    assert chat(r, "acme", "other").status_code == 403  # nothing changed

    screen = plain(pty("tenant", "set", "acme", "--policy", policy_file, "--token", token,
                       "--url", r.url))  # fmt: skip
    assert "tenant acme set: version 1 (approved by admin1, admin2)" in screen
    assert chat(r, "acme", "other").status_code == 200  # applied at once

    screen = plain(pty("tenant", "show", "--url", r.url, "--api-key", KEYS["ops"]))
    assert "tenant policies (version 1)" in screen
    assert "│ acme │ api │ 1 │ admin1, admin2 │" in screen
    assert "│ ops │ file │ 0 │ │" in screen
    code, doc = run_json("tenant", "show", "acme", "--url", r.url, "--api-key", KEYS["ops"])
    assert code == 0 and doc["version"] == 1
    (acme,) = doc["tenants"]
    assert acme["policy"] == POLICY and acme["policySha256"] == policy_sha256(POLICY)
    code, doc = run_json("tenant", "show", "--url", r.url, "--api-key", KEYS["acme"])
    assert code == 1 and doc["httpStatus"] == 403

    delete_token = _token_file(tmp_path, "delete", "acme", None)
    code, doc = run_json("tenant", "delete", "acme", "--token", delete_token, "--url", r.url)
    assert code == 0 and doc["ok"] and doc["deleted"] is True and doc["version"] == 2
    code, doc = run_json("tenant", "show", "acme", "--url", r.url, "--api-key", KEYS["ops"])
    (acme,) = doc["tenants"]
    assert (acme["source"], acme["version"], acme["policy"]) == ("api", 2, None)

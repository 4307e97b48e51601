"""The smaller doors (issue 25, Why 4): replays of legacy tokens, tenant ids on the public
metrics, label exhaustion, an editable audit log, model names probed before any token is
read, and JSON posted by a cross-site form."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.security.kit import (
    chat,
    keyed_runner,
    metric_lines,
    quorum,
    stand_in_models,
    start_refused,
    wait_loaded,
)
from tests.support.ports import free_port
from tests.support.runner_proc import start_runner
from tests.support.tokens import DEV_REGISTRY

pytestmark = pytest.mark.timeout(120)


def test_legacy_tokens_without_a_shared_nonce_store_refuse_to_start(tmp_path: Path) -> None:
    """Attack: a seed-form (HMAC) token carries no `aud`, and without Redis each replica
    keeps its own nonces: one token replays once per replica. Legacy mode needs REDIS_URL,
    or the runner does not start."""
    key = tmp_path / "legacy.key"
    key.write_text("0" * 64)
    env = {
        "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
        "GOVERNANCE_LEGACY_HMAC": "true",
        "VERIFIED_OP_TOKEN_KEY_PATH": str(key),
    }
    code, log = start_refused(env)
    assert code == 2, log
    assert "GOVERNANCE_LEGACY_HMAC" in log and "REDIS_URL" in log


def test_metrics_with_tenant_ids_only_on_the_metrics_port() -> None:
    """Attack: `/metrics` on the public port lists every tenant id and its counts. With
    METRICS_ON_API_PORT=false (the production setting) it answers only on METRICS_PORT; the
    picker's aggregate path (no tenant labels) stays where the picker reads it."""
    port = free_port()
    env = {"METRICS_PORT": str(port), "METRICS_ON_API_PORT": "false"}
    env["TENANT_RATE_LIMIT_secret-customer"] = "unlimited"  # declared: labelled by name
    with start_runner(models_file=stand_in_models(), env=env) as r:
        wait_loaded(r)
        assert chat(r.url, {"X-Tenant-ID": "secret-customer"}).status_code == 200
        public = httpx.get(r.url + "/metrics")
        assert public.status_code == 404 and "secret-customer" not in public.text
        assert httpx.get(r.url + "/metrics/picker").status_code == 200
        private = httpx.get(f"http://127.0.0.1:{port}/metrics")
        assert private.status_code == 200 and "secret-customer" in private.text


def test_tenant_labels_are_the_declared_tenants_only(tmp_path: Path) -> None:
    """Attack: 1,000 junk tenant ids pushed real tenants into `_other` (labels were first come,
    first served). Labels name the declared tenants only; anyone else counts as `_other`."""
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  acme: {}\n")
    with start_runner(models_file=stand_in_models(), env={"TENANTS_FILE": str(path)}) as r:
        wait_loaded(r)
        for n in range(20):
            assert chat(r.url, {"X-Tenant-ID": f"junk-{n}"}).status_code == 200
        assert chat(r.url, {"X-Tenant-ID": "acme"}).status_code == 200
        lines = metric_lines(r.url, "quorum_requests_total")
    tenants = {line.split('tenant="')[1].split('"')[0] for line in lines}
    assert tenants == {"acme", "_other"}, tenants


def test_an_edited_audit_log_is_detected(tmp_path: Path) -> None:
    """Attack: the audit log was plain JSON Lines: an edited or deleted record left no trace.
    Each record carries the hash of the one before it; `quorum audit verify FILE` exits 0 on
    the log as written and non-zero, naming the first bad line, once a record is edited."""
    with keyed_runner(tmp_path) as r:
        for _ in range(3):
            httpx.post(r.url + "/v1/cache/flush", json={"scope": "all", "verifiedOpToken": "junk"})
    audit = tmp_path / "audit.jsonl"
    intact = quorum("audit", "verify", str(audit))
    assert intact.returncode == 0, intact.stdout + intact.stderr
    original = audit.read_text().splitlines()
    assert len(original) == 3
    lines = list(original)
    record = json.loads(lines[1])
    record["reason"] = "ok"
    lines[1] = json.dumps(record, sort_keys=True, separators=(",", ":"))
    audit.write_text("\n".join(lines) + "\n")
    edited = quorum("audit", "verify", str(audit))
    assert edited.returncode != 0
    assert "line 2" in edited.stdout + edited.stderr
    audit.write_text("\n".join([original[0], original[2]]) + "\n")  # a record deleted
    deleted = quorum("audit", "verify", str(audit))
    assert deleted.returncode != 0 and "line 2" in deleted.stdout + deleted.stderr


def test_model_existence_is_not_revealed_before_a_token(tmp_path: Path) -> None:
    """Attack: without any token, `modelId` answers differed (400/404/401), so names under
    the model roots could be probed. Before a token is verified every modelId gets the same
    answer."""
    with keyed_runner(tmp_path) as r:
        answers = {}
        for model in ("m", "no-such-model", "../../etc/passwd", "weights.gguf"):
            for path in ("/v1/models/load", "/v1/models/unload"):
                a = httpx.post(r.url + path, json={"modelId": model})
                answers[(model, path)] = (a.status_code, a.json()["error"]["code"])
            a = httpx.post(r.url + "/v1/cache/flush", json={"scope": "model", "modelId": model})
            answers[(model, "flush")] = (a.status_code, a.json()["error"]["code"])
    assert set(answers.values()) == {(401, "missing_op_token")}, answers


def test_inference_requires_a_json_content_type(tmp_path: Path) -> None:
    """Attack: a cross-site form posts `text/plain` (a "simple" request, no CORS preflight)
    whose body is JSON, spending a tenant's share from its browser. Inference needs
    `Content-Type: application/json`: anything else is 415."""
    with start_runner(models_file=stand_in_models()) as r:
        wait_loaded(r)
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"X-Tenant-ID": "acme"} | ({"Content-Type": ctype} if ctype else {})
            a = httpx.post(r.url + "/v1/chat/completions", content=body, headers=headers)
            assert a.status_code == 415, (ctype, a.status_code)
            assert a.json()["error"]["code"] == "unsupported_media_type"
        ok = httpx.post(
            r.url + "/v1/chat/completions",
            content=body,
            headers={"Content-Type": "application/json; charset=utf-8"},
        )
        assert ok.status_code == 200

"""Governed lifecycle calls through HTTP: /v1/cache/flush on real runner processes."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.launch import FakeEngine, start_fake
from tests.support import forkserver
from tests.support.redis_server import RedisServer
from tests.support.runner_proc import REPO_ROOT, RunnerProcess, start_runner
from tests.support.tokens import DEV_AUDIT_KEY

KEYS = REPO_ROOT / "keys"
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


def quorum(*args: str) -> str:
    """Run the `quorum` CLI; its stdout."""
    done = forkserver.run("runner.runtime.cli", args, env=os.environ, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def registry_2_of_3(tmp: Path) -> Path:
    """The dev registry with cache-flush raised to 2-of-3."""
    doc = json.loads((KEYS / "registry.dev.json").read_text())
    doc["operations"]["cache-flush"] = {
        "threshold": 2,
        "principals": ["admin1", "admin2", "admin3"],
    }
    path = tmp / "registry.json"
    path.write_text(json.dumps(doc))
    return path


def flush_token(
    tmp: Path,
    signers: tuple[str, ...] = ("admin1", "admin2"),
    aud: str = "test-runner",
    operation: str = "cache-flush",
    params: tuple[str, ...] = ("scope=all",),
    model: str | None = None,
) -> Any:
    """A token made as signers would: propose, each signs the proposal alone, combine."""
    proposal = tmp / f"proposal-{os.urandom(4).hex()}.json"
    extra = ["--model", model] if model else []
    proposal.write_text(
        quorum(
            "token",
            "propose",
            "--operation",
            operation,
            *extra,
            *[a for p in params for a in ("--param", p)],
            "--aud",
            aud,
            "--iss",
            "gov-dev",
            "--ttl",
            "300",
        )
    )
    signed = []
    for name in signers:
        out = tmp / f"{proposal.stem}-{name}.json"
        out.write_text(quorum("token", "sign", str(proposal), "--key", str(KEYS / f"{name}.key")))
        signed.append(str(out))
    combined = (
        quorum("token", "combine", *signed) if len(signed) > 1 else Path(signed[0]).read_text()
    )
    return json.loads(combined)


class Governed:
    def __init__(self, runner: RunnerProcess, engine: FakeEngine, tmp: Path, audit: Path) -> None:
        self.runner, self.engine, self.tmp, self.audit = runner, engine, tmp, audit

    def flush(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
        return httpx.post(
            self.runner.url + "/v1/cache/flush", json=body, headers=headers, timeout=20
        )


@pytest.fixture
def governed(tmp_path: Path) -> Iterator[Governed]:
    audit = tmp_path / "audit.jsonl"
    with ExitStack() as stack:
        engine = stack.enter_context(start_fake("fake_openai", "--latency-ms", "0"))
        runner = stack.enter_context(
            start_runner(
                {"echo": engine.url},
                env={
                    "GOVERNANCE_REGISTRY": str(registry_2_of_3(tmp_path)),
                    "GOVERNANCE_AUDIT_LOG": str(audit),
                    "GOVERNANCE_AUDIT_KEY": str(DEV_AUDIT_KEY),
                },
            )
        )
        yield Governed(runner, engine, tmp_path, audit)


def test_flush_2_of_3_cli_token_runs_once_then_409(governed: Governed) -> None:
    """A 2-of-3 token from the CLI lets the flush run; the same token again is 409."""
    token = flush_token(governed.tmp)
    first = governed.flush({"scope": "all", "verifiedOpToken": token})
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["flushed"] is False and body["entriesRemoved"] == 0
    assert body["memoryFreedMB"] == 0 and "attached by URL" in body["reason"]
    again = governed.flush({"scope": "all", "verifiedOpToken": token})
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "nonce_replayed"


def test_flush_one_signature_is_403(governed: Governed) -> None:
    """One signer of a 2-of-3 operation is refused with 403."""
    token = flush_token(governed.tmp, signers=("admin1",))
    r = governed.flush({"scope": "all", "verifiedOpToken": token})
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "threshold_not_met"


@pytest.mark.parametrize(
    ("kwargs", "body"),
    [
        ({"aud": "another-runner"}, {"scope": "all"}),
        ({"operation": "model-unload", "model": "echo", "params": ()}, {"scope": "all"}),
        ({"params": ("scope=model",), "model": "echo"}, {"scope": "all"}),
        ({"params": ("scope=all",)}, {"scope": "model", "modelId": "echo"}),
    ],
    ids=["other-runner", "other-operation", "other-model", "other-scope"],
)
def test_flush_token_for_something_else_is_403(
    governed: Governed, kwargs: dict[str, Any], body: dict[str, Any]
) -> None:
    """A token signed for another runner, operation, model or scope is 403."""
    token = flush_token(governed.tmp, **kwargs)
    r = governed.flush({**body, "verifiedOpToken": token})
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "binding_mismatch"


def test_flush_token_in_header_is_accepted(governed: Governed) -> None:
    """The token may come in X-Op-Token instead of the body (base64url form)."""
    token = flush_token(governed.tmp)
    b64 = quorum("token", "inspect", json.dumps(token))  # sanity: inspect reads it
    assert "cache-flush" in b64
    encoded = _b64(token)
    r = governed.flush({"scope": "all"}, headers={"X-Op-Token": encoded})
    assert r.status_code == 200, r.text


def _b64(token: Any) -> str:
    import base64

    raw = json.dumps(token, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_flush_bad_request_spends_nothing(governed: Governed) -> None:
    """Bad bodies are 400/401 before governance, so the token stays usable; a model that is
    not loaded is told only to an approved token (404 after it is spent)."""
    token = flush_token(governed.tmp)
    assert governed.flush({"scope": "everything", "verifiedOpToken": token}).status_code == 400
    assert governed.flush({"scope": "all", "extra": 1, "verifiedOpToken": token}).status_code == 400
    assert governed.flush({"scope": "model", "modelId": "nope"}).status_code == 401
    model = flush_token(governed.tmp, params=("scope=model",), model="nope")
    unknown = {"scope": "model", "modelId": "nope", "verifiedOpToken": model}
    assert governed.flush(unknown).status_code == 404
    assert governed.flush(unknown).status_code == 409  # approved, so spent
    assert governed.flush({"scope": "all"}).status_code == 401
    raw = httpx.post(
        governed.runner.url + "/v1/cache/flush",
        timeout=10,
        content=b'{"scope": "all", "scope": "all"}',
    )
    assert raw.status_code == 400
    assert governed.flush({"scope": "all", "verifiedOpToken": token}).status_code == 200


def test_flush_decisions_are_audited(governed: Governed) -> None:
    """Accepted and rejected operations each leave an audit line, with no token material."""
    token = flush_token(governed.tmp)
    assert governed.flush({"scope": "all", "verifiedOpToken": token}).status_code == 200
    assert governed.flush({"scope": "all", "verifiedOpToken": token}).status_code == 409
    lines = [json.loads(line) for line in governed.audit.read_text().splitlines()]
    assert len(lines) == 2
    assert json.dumps(lines).count("signature") == 0
    approved, replayed = lines
    assert approved["operation"] == "cache-flush" and approved["runner_id"] == "test-runner"
    assert sorted(approved["principals"]) == ["admin1", "admin2"]
    assert approved["outcome"] == "approved" and approved["nonce_sha256"]
    assert replayed["outcome"] == "rejected" and replayed["reason"] == "nonce_replayed"
    metrics = httpx.get(governed.runner.url + "/metrics").text
    assert (
        'quorum_lifecycle_decisions_total{operation="cache-flush",outcome="approved"} 1.0'
        in metrics
    )
    assert (
        'quorum_lifecycle_decisions_total{operation="cache-flush",outcome="nonce_replayed"} 1.0'
        in metrics
    )


def test_flush_audit_unwritable_is_503_and_nothing_runs(tmp_path: Path) -> None:
    """An audit log that cannot be written makes lifecycle calls 503; inference still works."""
    with (
        start_fake("fake_openai", "--latency-ms", "0") as engine,
        start_runner(
            {"echo": engine.url},
            env={
                "GOVERNANCE_REGISTRY": str(registry_2_of_3(tmp_path)),
                "GOVERNANCE_AUDIT_LOG": "/dev/full",
                "GOVERNANCE_AUDIT_KEY": str(DEV_AUDIT_KEY),
            },
        ) as runner,
    ):
        token = flush_token(tmp_path)
        r = httpx.post(
            runner.url + "/v1/cache/flush",
            timeout=10,
            json={"scope": "all", "verifiedOpToken": token},
        )
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "audit_unavailable"
        assert httpx.post(runner.url + "/v1/chat/completions", json=CHAT).status_code == 200


def test_flush_without_registry_is_503() -> None:
    """No signer registry configured: lifecycle operations are refused (fail closed)."""
    with start_runner({}) as runner:
        r = httpx.post(
            runner.url + "/v1/cache/flush",
            json={"scope": "all", "verifiedOpToken": "eyJ"},
            timeout=10,
        )
        assert r.status_code == 503
        assert "GOVERNANCE_REGISTRY" in r.json()["error"]["message"]


def test_two_runners_one_redis_same_token_once(tmp_path: Path, redis_server: RedisServer) -> None:
    """The same token sent to two runners sharing Redis at once succeeds exactly once."""
    env = {"GOVERNANCE_REGISTRY": str(registry_2_of_3(tmp_path)), "REDIS_URL": redis_server.url}
    with (
        start_fake("fake_openai", "--latency-ms", "0") as engine,
        start_runner({"echo": engine.url}, env=env) as a,
        start_runner({"echo": engine.url}, env=env) as b,
        ThreadPoolExecutor(2) as pool,
    ):
        token = flush_token(tmp_path)
        results = list(
            pool.map(
                lambda r: (
                    httpx.post(
                        r.url + "/v1/cache/flush",
                        timeout=10,
                        json={"scope": "all", "verifiedOpToken": token},
                    ).status_code
                ),
                [a, b],
            )
        )
        assert sorted(results) == [200, 409]


def test_redis_down_lifecycle_503_inference_works(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Redis stopped: lifecycle calls fail closed (503); inference keeps being served."""
    env = {
        "GOVERNANCE_REGISTRY": str(registry_2_of_3(tmp_path)),
        "REDIS_URL": redis_server.url,
        "DEFAULT_RATE_LIMIT": "1000req/min",
    }
    with (
        start_fake("fake_openai", "--latency-ms", "0") as engine,
        start_runner({"echo": engine.url}, env=env) as runner,
    ):
        assert httpx.post(runner.url + "/v1/chat/completions", json=CHAT).status_code == 200
        redis_server.stop()
        token = flush_token(tmp_path)
        r = httpx.post(
            runner.url + "/v1/cache/flush",
            timeout=10,
            json={"scope": "all", "verifiedOpToken": token},
        )
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "nonce_store_unavailable"
        chat = httpx.post(runner.url + "/v1/chat/completions", json=CHAT, timeout=10)
        assert chat.status_code == 200


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda d: d["operations"]["model-load"].update(threshold=0), "threshold"),
        (lambda d: d["operations"]["model-load"].update(threshold=4), "threshold"),
        (lambda d: d["principals"].update(admin4=d["principals"]["admin1"]), "admin"),
        (
            lambda d: d["operations"].update(reboot={"threshold": 1, "principals": ["admin1"]}),
            "reboot",
        ),
        (lambda d: d["principals"].update(Admin5=["x"]), "Admin5"),
    ],
    ids=["threshold-0", "threshold-above-n", "key-twice", "unknown-operation", "bad-name"],
)
def test_start_refuses_unsafe_registry(tmp_path: Path, change: Any, fragment: str) -> None:
    """The runner will not start on an unsafe registry, and says which problem it found."""
    doc = json.loads((KEYS / "registry.dev.json").read_text())
    change(doc)
    path = tmp_path / "registry.json"
    path.write_text(json.dumps(doc))
    proc = forkserver.run(
        "runner", env={"GOVERNANCE_REGISTRY": str(path), "PATH": "/usr/bin:/bin"}, timeout=30
    )
    assert proc.returncode == 2
    assert b"GOVERNANCE_REGISTRY" in proc.stderr and fragment.encode() in proc.stderr

"""No tenant-visible answer carries engine log text (issue 17, point 6).

Two stand-in llama-servers print a recognisable line (a marker, a private path, another
request's id; tests/fixtures/fake_leaks_logs.py) and die: one while starting, one under a
request (printing that request's prompt too). Every answer a tenant can get is searched
for it: inference errors, capabilities, /health, /metrics, /v1/models, the load task, the
logs endpoint and the status page refusing a tenant. Admins read it at the logs endpoint.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.fixtures.fake_leaks_logs import LEAK_MARKER
from tests.support.engines import GOVERNED, caps, load, wait_task
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, fixture_bin, start_runner, wait_started
from tests.support.tokens import FAIRNESS, gateway_env

pytestmark = pytest.mark.timeout(90)

PROMPT_OF_A = "PROMPT-OF-TENANT-A-7731"
FORBIDDEN = (LEAK_MARKER, "/private/path", "req-abc", "weights.gguf")


def _models() -> str:
    lines = ["models:"]
    for model, behaviour in (("m", "leaks-at-start"), ("c", "leaks-on-request")):
        lines += [f"  - id: {model}", "    backend: llama-server", "    path: /dev/null"]
        lines += ["    preload: true", "    parallel: 1", "    vram_mb: 64", "    restart: false"]
        lines += [f"    bin: {fixture_bin('llama-server-' + behaviour)}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def runner() -> Iterator[RunnerProcess]:
    env = {**GOVERNED, **gateway_env()}
    with start_runner(models_file=_models(), env=env, wait_ready=False) as r:
        wait_started(r)
        yield r


def _text(r: httpx.Response) -> str:
    """Everything a client receives: status line, headers and body."""
    headers = "\n".join(f"{k}: {v}" for k, v in r.headers.items())
    return f"{r.status_code}\n{headers}\n{r.text}"


def _chat(url: str, model: str, tenant: str, content: str = "hi") -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    return httpx.post(
        url + "/v1/chat/completions", json=body, headers={FAIRNESS: tenant}, timeout=30
    )


def test_no_tenant_visible_answer_carries_engine_log_text(runner: RunnerProcess) -> None:
    """An engine that fails at start and one that dies under a request both log a secret
    line: no answer a tenant can get (errors, capabilities, health, metrics, model list,
    load task, refusals) contains it, nor another tenant's prompt; an admin reads both
    at `GET /v1/models/{id}/logs`."""
    url, seen = runner.url, {}
    failed = eventually(lambda: {f["id"] for f in caps(url)["models"]["failed"]} >= {"m"}, 30)
    assert failed
    crashed = _chat(url, "c", "tenant-a", PROMPT_OF_A)  # the engine dies under it
    assert crashed.status_code == 502 and crashed.json()["error"]["code"] == "engine_crashed"
    seen["crash error (tenant a)"] = crashed
    eventually(lambda: len(caps(url)["models"]["failed"]) == 2, 30, "both models failed")
    seen["chat to the crashed model"] = _chat(url, "c", "tenant-b")
    seen["chat to the model that failed to start"] = _chat(url, "m", "tenant-b")
    task = load(url, "m")
    assert task.status_code == 202, task.text
    done = wait_task(url, task.json()["taskId"])
    assert done["status"] == "failed"
    tenant_b = {FAIRNESS: "tenant-b"}
    seen["load task"] = httpx.get(f"{url}/v1/models/load/{done['taskId']}", headers=tenant_b)
    for path in ("/v1/capabilities", "/health", "/metrics", "/v1/models", "/ui/state.json"):
        seen[path] = httpx.get(url + path, headers=tenant_b)
    for model in ("m", "c"):
        refused = httpx.get(f"{url}/v1/models/{model}/logs", headers=tenant_b)
        assert refused.status_code == 403
        seen[f"logs of {model} (tenant)"] = refused
    assert seen["/v1/capabilities"].json()["models"]["failed"][0]["error"]  # a reason, still
    for what, answer in seen.items():
        text = _text(answer)
        for secret in FORBIDDEN:
            assert secret not in text, f"{what} shows {secret!r}:\n{text[:3000]}"
        if what != "crash error (tenant a)":
            assert PROMPT_OF_A not in text, f"{what} shows tenant a's prompt"
    admin = {FAIRNESS: "ops"}
    start_log = httpx.get(url + "/v1/models/m/logs", headers=admin).json()["lines"]
    crash_log = httpx.get(url + "/v1/models/c/logs", headers=admin).json()["lines"]
    assert any(LEAK_MARKER in line for line in start_log), start_log
    assert any(LEAK_MARKER in line for line in crash_log), crash_log
    assert any(PROMPT_OF_A in line for line in crash_log), crash_log

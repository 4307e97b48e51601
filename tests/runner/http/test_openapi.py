"""The runner's OpenAPI contract (`GET /openapi.json`, runner/http/openapi/) against a real runner.

One runner subprocess with governance on (the dev registry), an engine it reaches by URL
(`echo`, the fake OpenAI server) and one it starts itself (`later`, llama-server-ok, not
loaded at start; a governed load makes a real task of it). schemathesis runs over every
operation of the served document: its examples, coverage (boundary and invalid values,
missing headers, undocumented methods), fuzzing and stateful phases, with every check but
`positive_data_acceptance` (a made-up model, token or id is rightly refused) and
`use_after_free` (DELETE cancels a job or load task; its record stays readable). Lifecycle
calls go with made-up tokens: they must be refused with a documented 4xx. Half the drawn
task ids, model ids and tenants are real ones (schemathesis dictionaries), so answers past
the 404s are checked too.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import Route

from adapters.image_store import FILES_PATH
from faults import QuorumError
from runner.floor.models_file import ModelsFile
from runner.floor.settings import Settings
from runner.http.audio.handler import AUDIO_PATHS
from runner.http.chat import CHAT_PATHS
from runner.http.images.handler import IMAGES_PATH
from runner.http.openapi import openapi_document
from runner.http.openapi.components import ERROR_STATUSES, error_codes, error_rows
from runner.runtime.build import build_app
from tests.fixtures.launch import start_fake
from tests.support.engines import CHECKPOINT, GOVERNED, comfyui_root, load_and_wait
from tests.support.runner_proc import RunnerProcess, fixture_bin, start_runner

pytestmark = pytest.mark.timeout(120)

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
MAX_EXAMPLES = 30  # per operation and phase: the run takes ~25 s on 2 cores
ADMIN = "ops"

CONFIG = """\
[dictionaries.tasks]
values = [{task!r}]
[dictionaries.jobs]
values = [{job!r}]
[dictionaries.files]
values = [{file!r}]
[dictionaries.models]
values = ["echo", "later", "sd"]
[dictionaries.tenants]
values = [{admin!r}]
[dictionaries.ui]
values = ["app.js", "style.css"]

[parameters]
"path.taskId" = {{ dictionary = "tasks", probability = 0.5 }}
"path.jobId" = {{ dictionary = "jobs", probability = 0.5 }}
"path.file" = {{ dictionary = "files", probability = 0.5 }}
"path.modelId" = {{ dictionary = "models", probability = 0.5 }}
"body.modelId" = {{ dictionary = "models", probability = 0.5 }}
"path.name" = {{ dictionary = "ui", probability = 0.5 }}
"header.X-Tenant-ID" = {{ dictionary = "tenants", probability = 0.3 }}
"header.x-llm-d-inference-fairness-id" = {{ dictionary = "tenants", probability = 0.7 }}
# a deadline the engines meet: a shorter one is rightly 504 deadline_exceeded once the
# engine's answer is later than it (docs/api.md, Deadlines;
# tests/runner/http/test_engine_deadline.py)
"header.X-Request-Deadline-Ms" = "600000"
"header.x-llm-d-slo-ttft-ms" = "600000"
"""


def _models_file(engine_url: str, comfy_url: str) -> str:
    return (
        "models:\n"
        f"  - {{id: echo, backend: openai, url: '{engine_url}'}}\n"
        f"  - {{id: later, backend: llama-server, path: /dev/null, vram_mb: 64, "
        f"bin: '{fixture_bin('llama-server-ok')}'}}\n"
        f"  - {{id: sd, backend: comfyui, url: '{comfy_url}', checkpoint: {CHECKPOINT}}}\n"
    )


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerProcess]:
    root = tmp_path_factory.mktemp("openapi")
    folder = comfyui_root(root / "ComfyUI")
    with ExitStack() as stack:
        engine = stack.enter_context(start_fake("fake_openai", "--latency-ms", "0"))
        comfy = stack.enter_context(start_fake("fake_comfyui", "--base-directory", str(folder)))
        env = {**GOVERNED, "TENANT_IDENTITY": "gateway", "ADMIN_TENANTS": ADMIN}
        env["GATEWAY_PEERS"] = "127.0.0.1"  # gateway mode needs its gateway named
        env["LIFECYCLE_RATE_LIMIT"] = "100000/minute"  # the fuzzer calls them fast
        env["AUTH_FAILURE_SOURCE_LIMIT"] = "100000/minute"  # and fails them (each counts)
        env["IMAGES_DIR"] = str(root / "images")
        yield stack.enter_context(
            start_runner(models_file=_models_file(engine.url, comfy.url), env=env)
        )


def _image(url: str, **headers: str) -> httpx.Response:
    body = {"model": "sd", "prompt": "a kite", "size": "64x64", "response_format": "url"}
    headers = {"x-llm-d-inference-fairness-id": ADMIN, **headers}
    return httpx.post(url + "/v1/images/generations", json=body, headers=headers, timeout=30)


def _operations(doc: dict[str, Any]) -> set[tuple[str, str]]:
    """(method, path) of every operation, path parameters written `{}`."""
    out = set()
    for path, item in doc["paths"].items():
        shape = _shape(path)
        out |= {(m.upper(), shape) for m in item if m in ("get", "post", "put", "delete")}
    return out


def _shape(path: str) -> str:
    parts = ["{}" if p.startswith("{") else p for p in path.split("/")]
    return "/".join(parts)


def test_openapi_documents_every_route() -> None:
    """Every route the runner serves, control plane and bare data path, is in the document."""
    app = build_app(Settings(), ModelsFile())
    served = {
        (method, _shape(route.path.replace(":path", "")))
        for route in app.control.routes
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    }
    served |= {("POST", p) for p in (*CHAT_PATHS, *AUDIO_PATHS, IMAGES_PATH)}
    served.add(("GET", FILES_PATH + "{}"))
    assert served - _operations(openapi_document()) == set()


def test_openapi_error_statuses_cover_every_error_row() -> None:
    """Every status an error row answers with has its envelope in the document."""
    error_codes()  # imports every package's error table
    statuses = {row.status for row in error_rows(QuorumError)} - {499, 500}
    assert statuses <= set(ERROR_STATUSES)
    assert set(ERROR_STATUSES) <= {
        int(s[1:]) for s in openapi_document()["components"]["responses"]
    }


def test_openapi_served_as_3_1_with_the_envelope(runner: RunnerProcess) -> None:
    """`GET /openapi.json` answers the 3.1 document, its errors the runner's envelope."""
    r = httpx.get(runner.url + "/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = r.json()
    assert doc["openapi"] == "3.1.0"
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["properties"]["model"][
        "examples"
    ] == ["echo", "later", "sd"]
    envelope = doc["components"]["schemas"]["Error429"]["properties"]["error"]
    # a token budget without room (issue 26), the source's failed authentications or
    # lifecycle calls, the tenant's live jobs (issue 25) are 429s too
    assert envelope["properties"]["code"]["enum"] == [
        "http_error",
        "lifecycle_rate_limited",
        "rate_limit_exceeded",
        "token_budget_exceeded",
        "too_many_auth_failures",
        "too_many_jobs",
        "too_many_source_connections",
    ]
    headers = doc["components"]["responses"]["D429"]["headers"]
    assert {"Retry-After", "RateLimit-Limit", "X-Request-Id", "X-Queue-Wait-Ms"} <= set(headers)


def test_openapi_schemathesis_finds_no_5xx_and_no_violation(
    runner: RunnerProcess, tmp_path: Path
) -> None:
    """schemathesis over every operation: no 5xx, every status, header and body documented."""
    task = load_and_wait(runner.url, "later")
    assert task["status"] == "completed", task
    image = _image(runner.url)
    assert image.status_code == 200, image.text
    job = _image(runner.url, Prefer="respond-async")
    assert job.status_code == 202, job.text
    config = tmp_path / "schemathesis.toml"
    file = image.json()["data"][0]["url"].rsplit("/", 1)[1]
    ids = {"task": task["taskId"], "job": job.json()["id"], "file": file}
    config.write_text(CONFIG.format(**ids, admin=ADMIN))
    started = time.monotonic()
    run = subprocess.run(
        [
            str(SCHEMATHESIS),
            "--config-file",
            str(config),
            "--no-color",
            "run",
            runner.url + "/openapi.json",
            "--checks",
            "all",
            "--exclude-checks",
            # a made-up model, token or id is rightly refused; DELETE on a job or a load
            # task cancels it, and the cancelled record stays readable (docs/api.md)
            "positive_data_acceptance,use_after_free",
            "--phases",
            "examples,coverage,fuzzing,stateful",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--workers",
            "1",
            "--generation-database",
            "none",
            "--request-timeout",
            "20",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
    )
    took = time.monotonic() - started
    out = run.stdout + run.stderr
    assert run.returncode == 0, f"{out}\n--- runner log ---\n{runner.log()[-4000:]}"
    operations = len(_operations(openapi_document())) - 1  # all but /openapi.json itself
    assert f"Tested: {operations}" in out, out  # every operation of the document ran
    print(f"schemathesis: {operations} operations in {took:.1f} s")

"""Governed async load and unload through HTTP, on real runner processes.

Engines are the stand-in llama-servers of tests/fixtures/bin/ where only the lifecycle
matters, and the real llama-server with Gemma where memory must be real (eviction).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.engines import processes_with, wait_task
from tests.support.poll import eventually
from tests.support.real_engines import LlamaServer
from tests.support.redis_server import RedisServer
from tests.support.runner_proc import RunnerProcess, fixture_bin, start_runner
from tests.support.tokens import DEV_REGISTRY, dev_token

pytestmark = pytest.mark.timeout(180)

ENV = {"GOVERNANCE_REGISTRY": str(DEV_REGISTRY)}


def _entry(model: str, binary: str | None = None, path: str = "/dev/null", **extra: object) -> str:
    lines = [f"  - id: {model}", "    backend: llama-server", f"    path: {path}"]
    if binary:  # a stand-in engine: a small declared footprint, whatever the machine has
        lines += [f"    bin: {fixture_bin(binary)}", "    vram_mb: 64"]
    lines += [f"    {k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def _load(url: str, model: str, **fields: Any) -> httpx.Response:
    body = {"modelId": model, **fields}
    params = {k: v for k, v in body.items() if k != "modelId"}
    token = dev_token("model-load", model, params)
    return httpx.post(url + "/v1/models/load", json={**body, "verifiedOpToken": token}, timeout=30)


def _unload(url: str, model: str) -> httpx.Response:
    token = dev_token("model-unload", model, {})
    body = {"modelId": model, "verifiedOpToken": token}
    return httpx.post(url + "/v1/models/unload", json=body, timeout=120)


def poll_model_load_task(url: str, task_id: str, interval_s: float = 5.0) -> dict[str, Any]:
    """The seed's `pollModelLoadTask` (system-protocol-api.js), line for line: 60 polls,
    5 s apart, `completed` → {modelId, verified, gpuMemoryUsedMB}, `failed` → raise."""
    for _ in range(60):
        time.sleep(interval_s)
        status = httpx.get(f"{url}/v1/models/load/{task_id}").json()
        if status["status"] == "completed":
            return {
                "modelId": status["modelId"],
                "verified": True,
                "gpuMemoryUsedMB": status["gpuMemoryUsedMB"],
            }
        if status["status"] == "failed":
            raise RuntimeError(f"Model load failed: {status['error']}")
    raise RuntimeError("Model load timeout")


def _caps(url: str) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(url + "/v1/capabilities").json()
    return doc


def _ids(models: dict[str, Any], kind: str) -> list[str]:
    return [m["id"] for m in models[kind]]


def _chat_code(url: str, model: str) -> tuple[int, str]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    return r.status_code, r.json()["error"]["code"]


@pytest.fixture
def slow_runner() -> Iterator[RunnerProcess]:
    models = "models:\n" + _entry("slow", "llama-server-slow")
    with start_runner(models_file=models, env=ENV) as r:
        yield r


def test_load_answers_202_at_once_then_seed_client_completes(slow_runner: RunnerProcess) -> None:
    """POST load answers 202 with a task while the engine is still starting; capabilities
    show it loading, then loaded; the seed's own polling logic completes unchanged."""
    url = slow_runner.url
    r = _load(url, "slow")
    assert r.status_code == 202
    accepted = r.json()
    assert accepted["status"] == "loading" and accepted["progress"] == 0.0
    assert isinstance(accepted["eta"], int | float)
    first = httpx.get(f"{url}/v1/models/load/{accepted['taskId']}").json()
    assert first["status"] in ("queued", "loading")
    seen_loading = False
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not seen_loading:
        seen_loading = any(m["id"] == "slow" for m in _caps(url)["models"]["loading"])
        time.sleep(0.05)
    assert seen_loading
    result = poll_model_load_task(url, accepted["taskId"])
    assert result["modelId"] == "slow" and result["gpuMemoryUsedMB"] > 0
    done = httpx.get(f"{url}/v1/models/load/{accepted['taskId']}").json()
    assert done["loadTimeMs"] > 0 and done["progress"] == 1.0
    assert "slow" in [m["id"] for m in _caps(url)["models"]["loaded"]]
    chat = {"model": "slow", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(url + "/v1/chat/completions", json=chat).status_code == 200


def test_load_refused_before_governance_and_without_token(slow_runner: RunnerProcess) -> None:
    """A bad body is 400 before governance; without a token every modelId gets the same
    401 (what the model roots hold is not told to anyone without one); an approved token
    for a path outside the roots is 400, for an unknown model 404; a wrong token 403."""
    url = slow_runner.url
    r = httpx.post(url + "/v1/models/load", json={"modelId": "slow", "quantization": "int3"})
    assert r.status_code == 400
    for model in ("../../etc/passwd.gguf", "nope", "slow"):
        r = httpx.post(url + "/v1/models/load", json={"modelId": model})
        assert r.status_code == 401 and r.json()["error"]["code"] == "missing_op_token"
    for model, status in (("../../etc/passwd.gguf", 400), ("nope", 404)):
        token = dev_token("model-load", model, {})
        r = httpx.post(url + "/v1/models/load", json={"modelId": model, "verifiedOpToken": token})
        assert r.status_code == status, r.text
    token = dev_token("model-load", "other", {})
    r = httpx.post(url + "/v1/models/load", json={"modelId": "slow", "verifiedOpToken": token})
    assert r.status_code == 403
    assert httpx.get(url + "/v1/models/load/load-unknown").status_code == 404


def test_load_of_model_already_loading_joins_its_task(slow_runner: RunnerProcess) -> None:
    """Two loads of one model while it loads answer with the same task."""
    a = _load(slow_runner.url, "slow").json()
    b = _load(slow_runner.url, "slow").json()
    assert a["taskId"] == b["taskId"]
    assert wait_task(slow_runner.url, a["taskId"])["status"] == "completed"


def test_not_loaded_model_is_404_model_not_loaded(slow_runner: RunnerProcess) -> None:
    """A model of the catalog that is not loaded (and not autoload) answers 404."""
    chat = {"model": "slow", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(slow_runner.url + "/v1/chat/completions", json=chat)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_loaded"


def test_cancel_load_stops_it(slow_runner: RunnerProcess) -> None:
    """DELETE on a running load task (governed task-cancel) cancels it; nothing stays loaded."""
    task = _load(slow_runner.url, "slow").json()["taskId"]
    token = dev_token("task-cancel", "slow", {"taskId": task})
    r = httpx.request(
        "DELETE",
        f"{slow_runner.url}/v1/models/load/{task}",
        headers={"X-Op-Token": json.dumps(token)},
    )
    assert r.status_code == 200, r.text
    assert wait_task(slow_runner.url, task)["status"] == "cancelled"
    eventually(lambda: "slow" not in _ids(_caps(slow_runner.url)["models"], "loading"))
    assert "slow" not in _ids(_caps(slow_runner.url)["models"], "loaded")
    # an engine the cancel caught starting answers 503 model_unloading while it stops
    eventually(lambda: _chat_code(slow_runner.url, "slow") == (404, "model_not_loaded"))


def test_autoload_model_loads_on_first_request() -> None:
    """A model marked autoload loads when a request names it; the request is then served."""
    models = "models:\n" + _entry("auto", "llama-server-slow", autoload=True)
    with start_runner(models_file=models, env=ENV) as r:
        chat = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
        resp = httpx.post(r.url + "/v1/chat/completions", json=chat, timeout=60)
        assert resp.status_code == 200
        assert int(resp.headers["x-queue-wait-ms"]) > 0  # it waited for the cold load


def test_restart_mid_load_reads_failed_and_second_replica_answers(
    redis_server: RedisServer,
) -> None:
    """A runner killed mid-load leaves its task `failed` with the reason after it restarts;
    with Redis, another replica answers the task's status. (An engine that never turns
    healthy: the load is still under way however long the second replica takes to start.)"""
    models = "models:\n" + _entry("slow", "llama-server-never-healthy")
    env = {**ENV, "REDIS_URL": redis_server.url, "RUNNER_ID": "replica-1"}
    with start_runner(models_file=models, env=env) as first:
        token = dev_token("model-load", "slow", {}, aud="replica-1")
        task = httpx.post(
            first.url + "/v1/models/load", json={"modelId": "slow", "verifiedOpToken": token}
        ).json()["taskId"]
        env2 = {**env, "RUNNER_ID": "replica-2"}
        with start_runner(models_file=models, env=env2) as second:
            seen = httpx.get(f"{second.url}/v1/models/load/{task}").json()
            assert seen["taskId"] == task and seen["status"] in ("queued", "loading")
            first.proc.kill()
            first.proc.wait(10)
    with start_runner(models_file=models, env=env) as again:
        doc = httpx.get(f"{again.url}/v1/models/load/{task}").json()
        assert doc["status"] == "failed"
        assert "interrupted" in doc["error"] and "restarted" in doc["error"]


@pytest.fixture
def gemma_pair(real_llama_server: LlamaServer) -> Iterator[RunnerProcess]:
    """Two real Gemma engines that do not both fit in the runner's memory budget."""
    gemma = str(real_llama_server.gemma)
    models = "models:\n" + _entry("g1", path=gemma, preload=True, context_length=512)
    models += _entry("g2", path=gemma, context_length=512)
    # One engine holds ~350 MB resident (weights mapped + KV + buffers): one fits, two do not.
    env = {**ENV, "RUNNER_MEMORY_MB": "560"}
    with start_runner(models_file=models, env=env, ready_timeout=120) as r:
        yield r


def test_load_that_does_not_fit_evicts_idle_model(gemma_pair: RunnerProcess) -> None:
    """Loading g2 where only one Gemma fits evicts g1 (idle, unpinned), then completes."""
    url = gemma_pair.url
    assert "g1" in [m["id"] for m in _caps(url)["models"]["loaded"]]
    task = _load(url, "g2").json()["taskId"]
    done = wait_task(url, task)
    assert done["status"] == "completed", done
    loaded = [m["id"] for m in _caps(url)["models"]["loaded"]]
    assert loaded == ["g2"]


def test_evict_model_and_unload_during_stream(gemma_pair: RunnerProcess) -> None:
    """Unload during a streamed answer: the answer completes, then the engine stops and the
    freed memory is measured; `evictModel` names what goes first."""
    url = gemma_pair.url
    body = {
        "model": "g1",
        "stream": True,
        "max_tokens": 24,
        "messages": [{"role": "user", "content": "Tell me a short story."}],
    }
    with (
        ThreadPoolExecutor(1) as pool,
        httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as s,
    ):
        it = s.iter_bytes()
        next(it)
        unloading = pool.submit(_unload, url, "g1")
        rest = b"".join(it)
        result = unloading.result(120)
    assert b"[DONE]" in rest and b"error" not in rest
    assert result.status_code == 200, result.text
    doc = result.json()
    assert doc["modelId"] == "g1" and doc["gpuMemoryFreedMB"] > 0 and doc["kvCacheFlushed"]
    task = _load(url, "g1").json()["taskId"]
    assert wait_task(url, task)["status"] == "completed"
    task = _load(url, "g2", evictModel="g1").json()["taskId"]
    assert wait_task(url, task)["status"] == "completed"
    assert [m["id"] for m in _caps(url)["models"]["loaded"]] == ["g2"]


def test_pinned_model_never_evicted_load_fails_with_reason(real_llama_server: LlamaServer) -> None:
    """With g1 pinned and no room, loading g2 fails, saying what did not fit."""
    gemma = str(real_llama_server.gemma)
    models = "models:\n" + _entry("g1", path=gemma, preload=True, pin=True)
    models += _entry("g2", path=gemma)
    with start_runner(
        models_file=models, env={**ENV, "RUNNER_MEMORY_MB": "560"}, ready_timeout=120
    ) as r:
        done = wait_task(r.url, _load(r.url, "g2").json()["taskId"])
        assert done["status"] == "failed"
        assert "does not fit" in done["error"] and "pinned" in done["error"]
        assert [m["id"] for m in _caps(r.url)["models"]["loaded"]] == ["g1"]


def test_runner_sigterm_mid_load_stops_engine() -> None:
    """A runner stopped (SIGTERM) while its engine loads stops that engine too."""
    models = "models:\n" + _entry("slow", "llama-server-slow")
    with start_runner(models_file=models, env=ENV) as r:
        _load(r.url, "slow")
        eventually(lambda: bool(processes_with("--load-ms", parent=r.proc.pid)))
        [(pid, _)] = processes_with("--load-ms", parent=r.proc.pid)
        r.proc.send_signal(signal.SIGTERM)
        assert r.proc.wait(30) == 0
    eventually(lambda: not _alive(pid), timeout=5)


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def test_load_of_repo_not_on_disk_offline_fails_with_reason(tmp_path: Path) -> None:
    """A Hugging Face repo that is not in HF_HOME is downloaded; offline, the task fails
    saying so."""
    models = "models:\n" + _entry("slow", "llama-server-slow")
    env = {**ENV, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    with start_runner(models_file=models, env=env) as r:
        accepted = _load(r.url, "someorg/some-model-GGUF")
        assert accepted.status_code == 202
        done = wait_task(r.url, accepted.json()["taskId"])
        assert done["status"] == "failed"
        assert "someorg/some-model-GGUF" in done["error"] and "download failed" in done["error"]

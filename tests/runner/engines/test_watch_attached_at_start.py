"""An engine attached by URL that does not answer when the runner starts
(docs/reliability.md, sections 2 and 6). Attaching an `openai`, llama-server or vLLM engine
sends nothing that must succeed, so the watch (runner/engines/watch.py) is what finds it
dead; attaching a ComfyUI reads its `/system_stats`, so its load fails at once."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.runner.engines.test_watch_attached_kinds import KINDS, attached_engine
from tests.support.engines import CHECKPOINT, caps
from tests.support.poll import eventually
from tests.support.ports import free_port
from tests.support.runner_proc import start_runner, wait_started

pytestmark = pytest.mark.timeout(60)

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


def _failed(url: str) -> dict[str, str]:
    return {f["id"]: f["error"] for f in caps(url)["models"]["failed"]}


def test_attached_engine_dead_at_start_is_502_then_failed_with_retry_after() -> None:
    """Nobody listens at the model's URL: a request is 502 `engine_unavailable` until the
    watch has missed three probes (or already 503); then the model reads failed, /health
    503 `unhealthy`, and requests get 503 `model_unavailable` with Retry-After."""
    dead = f"http://127.0.0.1:{free_port()}"
    with start_runner({"echo": dead}, env={"ENGINE_STATS_INTERVAL_S": "0.5"}) as runner:
        url = runner.url
        first = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=10)
        code = (first.status_code, first.json()["error"]["code"])
        assert code in ((502, "engine_unavailable"), (503, "model_unavailable")), first.text
        reason = eventually(lambda: _failed(url).get("echo"), 15, "echo failed")
        assert "stopped answering" in reason and dead not in reason
        health = httpx.get(url + "/health", timeout=10)
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"
        refused = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=10)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_unavailable"
        assert int(refused.headers["Retry-After"]) > 0


IMAGE = {"model": "sd", "prompt": "a kite", "size": "64x64"}
COMFYUI = next(k for k in KINDS if k.backend == "comfyui")


def test_attached_comfyui_unreachable_at_start_fails_its_load_and_comes_back(
    tmp_path: Path,
) -> None:
    """A ComfyUI attached by `url` where nobody listens: attaching reads its `/system_stats`,
    so the load fails at once (the other kinds wait for the watch). The runner still turns
    ready; the model reads failed, "ComfyUI is unreachable", without its URL; `/health` is
    503 `unhealthy` (its only model) and an image request gets 503 `model_unavailable` with
    the reason and Retry-After. Once a ComfyUI (the fake) listens there, the watch asks for
    a load and the model serves."""
    port = free_port()
    dead = f"http://127.0.0.1:{port}"
    entry = f"{{id: sd, backend: comfyui, url: '{dead}', checkpoint: {CHECKPOINT}}}"
    models = f"models:\n  - {entry}\n"
    env = {"ENGINE_STATS_INTERVAL_S": "0.3"}
    with start_runner(models_file=models, env=env, wait_ready=False) as runner:
        wait_started(runner)
        url = runner.url
        send = lambda: httpx.post(url + "/v1/images/generations", json=IMAGE, timeout=60)  # noqa: E731
        reason = eventually(lambda: _failed(url).get("sd"), 15, "sd failed")
        health = httpx.get(url + "/health", timeout=10)
        refused = send()
        with attached_engine(COMFYUI, port, tmp_path):
            eventually(lambda: "sd" not in _failed(url) and send().status_code == 200, 45, "back")
    assert "ComfyUI is unreachable" in reason, reason
    assert dead not in reason and str(port) not in reason, reason
    assert health.status_code == 503 and health.json()["status"] == "unhealthy", health.text
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "model_unavailable" and "unreachable" in error["reason"], error
    assert int(refused.headers["Retry-After"]) > 0

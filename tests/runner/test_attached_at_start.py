"""An engine attached by URL that does not answer when the runner starts
(docs/reliability.md, sections 2 and 6): attaching it sends nothing that must succeed, so
the watch (runner/attached_watch.py) is what finds it dead."""

from __future__ import annotations

import httpx
import pytest

from tests.support.engines import caps, eventually
from tests.support.redis_server import free_port
from tests.support.runner_proc import start_runner

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

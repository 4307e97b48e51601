"""Engines attached by URL are probed (runner/engines/watch.py): a dead one turns its model
failed, and it comes back by itself when the engine answers again (issue 17, point 4)."""

from __future__ import annotations

import httpx
import pytest

from tests.fixtures.launch import start_fake
from tests.support.engines import caps
from tests.support.poll import eventually
from tests.support.runner_proc import start_runner

pytestmark = pytest.mark.timeout(60)

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


def _failed(url: str) -> dict[str, str]:
    return {f["id"]: f["error"] for f in caps(url)["models"]["failed"]}


def _loaded(url: str) -> list[str]:
    return [m["id"] for m in caps(url)["models"]["loaded"]]


def test_attached_engine_death_fails_its_model_and_its_return_revives_it() -> None:
    """The attached engine dies: within a few probes the model reads failed (reason named,
    no exit code), /health is 503 unhealthy, a chat gets 503 model_unavailable with
    Retry-After; the engine back on its port: the model is loaded again and serves."""
    with start_fake("fake_openai", "--latency-ms", "1") as engine:
        port = engine.port
        env = {"ENGINE_STATS_INTERVAL_S": "0.2"}
        with start_runner({"echo": engine.url}, env=env) as runner:
            url = runner.url
            assert httpx.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
            engine.kill()
            reason = eventually(lambda: _failed(url).get("echo"), 15, "echo failed")
            assert "stopped answering" in reason and engine.url not in reason
            health = httpx.get(url + "/health")
            assert health.status_code == 503 and health.json()["status"] == "unhealthy"
            refused = httpx.post(url + "/v1/chat/completions", json=CHAT)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "model_unavailable"
            assert int(refused.headers["retry-after"]) > 0
            with start_fake("fake_openai", "--latency-ms", "1", "--port", str(port)):
                eventually(lambda: _loaded(url) == ["echo"], 15, "echo loaded again")
                assert httpx.get(url + "/health").status_code == 200
                again = httpx.post(url + "/v1/chat/completions", json=CHAT)
                assert again.status_code == 200, again.text

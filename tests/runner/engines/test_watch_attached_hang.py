"""An attached engine that hangs, its probes unanswered (docs/reliability.md, section 6):
the watch gives it up after three probes time out, and the request stuck on it ends then,
not after ENGINE_READ_TIMEOUT_S."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.fixtures.launch import start_fake
from tests.support.engines import caps
from tests.support.runner_proc import start_runner

pytestmark = pytest.mark.timeout(90)

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


def test_attached_hang_cuts_the_stuck_request_with_engine_crashed_and_fails_the_model() -> None:
    """An engine that accepts and never answers, /v1/models included: the request on it
    gets 502 `engine_crashed` naming the missed probes once three have timed out (5 s
    each), well before ENGINE_READ_TIMEOUT_S (300 s); the model reads failed, no exit code."""
    with (
        start_fake("fake_hangs", "--hang-health") as engine,
        start_runner({"echo": engine.url}, env={"ENGINE_STATS_INTERVAL_S": "0.5"}) as runner,
    ):
        started = time.monotonic()
        r = httpx.post(runner.url + "/v1/chat/completions", json=CHAT, timeout=60)
        took = time.monotonic() - started
        assert r.status_code == 502, r.text
        error = r.json()["error"]
        assert error["code"] == "engine_crashed" and "stopped answering" in error["message"]
        assert took < 60, took
        [failed] = caps(runner.url)["models"]["failed"]
        assert failed["id"] == "echo" and failed["exitCode"] is None

"""The crash loop through a real engine (docs/reliability.md, section 4): a `restart: true`
model whose engine is killed (SIGKILL) each time it comes back stays failed after the 6th
crash in a row (`runner/scheduler/lifecycle.py` `_crashed`: more than `max_restarts`, 5,
each within 300 s of coming back).

The engines are the crash contract's real ones (tests/runner/engines/test_crash_contract.py):
llama-server and the faster-whisper worker. ENGINE_RESTART_BACKOFF_S shortens the backoff
(1, 2, 4, 8, 16 times it) so the five restarts take seconds, not 31 s.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from tests.runner.engines.test_crash_contract import LLAMA, WHISPER
from tests.support.crash_contract import CrashKind, metric
from tests.support.engines import caps
from tests.support.poll import eventually
from tests.support.runner_proc import start_runner, wait_started

pytestmark = pytest.mark.timeout(240)

CRASHES = 6  # max_restarts (5) + 1
KINDS = [LLAMA, WHISPER]


def _failed(url: str, model: str) -> dict[str, object] | None:
    return next((m for m in caps(url)["models"]["failed"] if m["id"] == model), None)


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_crash_loop_sixth_crash_in_a_row_leaves_the_model_failed(
    kind: CrashKind, tmp_path: Path
) -> None:
    """The real engine killed with SIGKILL each time the restarted one has served a request:
    restarted after each of the first 5 crashes, not after the 6th; the model is failed
    with the reason "...; not restarted after 6 crashes in a row" (capabilities), a new
    request gets 503 `model_unavailable` with that reason and Retry-After, `/health` is 503
    `unhealthy` (its only model), `quorum_engine_crashes_total` counts all 6 crashes and
    `quorum_engine_restarts_total` the 5 restarts."""
    env = {**kind.env(tmp_path), "ENGINE_RESTART_BACKOFF_S": "0.1"}
    with start_runner(
        models_file=kind.models_file(tmp_path, True), env=env, wait_ready=False
    ) as runner:
        wait_started(runner, kind.ready_timeout)
        url, model = runner.url, kind.model
        killed: list[int] = []
        for crash in range(1, CRASHES + 1):
            # the engine started for the crash-th time serves (so the scheduler has it ready)
            served = kind.quick(url, f"before-crash-{crash}")
            assert served.status_code == 200, (crash, served.text, runner.log()[-3000:])
            pid = kind.engine_pid(runner)
            assert pid not in killed, (crash, pid, killed)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            eventually(lambda n=crash: metric(url, "quorum_engine_crashes_total", model) == n,
                       30, f"crash {crash} counted")  # fmt: skip
        failed = eventually(lambda: _failed(url, model), 30, "the model failed for good")
        refused = kind.quick(url, "after-the-loop")
        health = httpx.get(url + "/health", timeout=10)
        restarts = metric(url, "quorum_engine_restarts_total", model)
        crashes = metric(url, "quorum_engine_crashes_total", model)
        log = runner.log()
    reason = f"not restarted after {CRASHES} crashes in a row"
    assert reason in str(failed["error"]) and "SIGKILL" in str(failed["error"]), failed
    assert failed["exitCode"] == -9, failed
    assert refused.status_code == 503, (refused.text, log[-3000:])
    error = refused.json()["error"]
    assert error["code"] == "model_unavailable" and reason in error["reason"], error
    assert int(refused.headers["Retry-After"]) > 0
    assert health.status_code == 503 and health.json()["status"] == "unhealthy", health.text
    assert (crashes, restarts) == (CRASHES, CRASHES - 1)

"""The runner supervising engines that fail: one stand-in llama-server per failure mode.

Each test starts the real runner as a subprocess with LLAMA_SERVER_BIN pointing at a script
in tests/fixtures/bin/, so the runner's whole start-up, crash and exit paths run for real.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runner.memory.proc import child_pids
from tests.support.runner_proc import RunnerProcess, fixture_bin, start_runner, wait_started
from tests.support.tokens import FAIRNESS, gateway_env

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _models(**extra: object) -> str:
    lines = ["models:", "  - id: m", "    backend: llama-server", "    path: /dev/null"]
    lines += ["    preload: true", "    parallel: 1", "    vram_mb: 64"]
    lines += [f"    {k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in extra.items()]
    lines += [
        "  - id: other",
        "    backend: llama-server",
        "    path: /dev/null",
        "    preload: true",
    ]
    lines += [f"    bin: {fixture_bin('llama-server-ok')}", "    vram_mb: 64"]
    return "\n".join(lines) + "\n"


AS_TENANT = {FAIRNESS: "acme"}  # the gateway names the tenant (TENANT_IDENTITY=gateway)


def _runner(binary: str, **extra: object) -> Iterator[RunnerProcess]:
    env = {"LLAMA_SERVER_BIN": fixture_bin(binary), **gateway_env()}
    with start_runner(models_file=_models(**extra), env=env, wait_ready=False) as runner:
        wait_started(runner)
        yield runner


def _failed(runner: RunnerProcess) -> dict[str, object]:
    caps = httpx.get(runner.url + "/v1/capabilities").json()
    failed = {f["id"]: f for f in caps["models"]["failed"]}
    return failed.get("m", {})


def _engine_pids(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            pids.append(int(entry.name))
    return pids


def test_engine_exits_at_start_model_failed_with_exit_code_and_log() -> None:
    """An engine that exits while starting: failed with its exit code; its last log lines
    are for admins (the logs endpoint), never in what a tenant reads."""
    line = "exiting due to model loading error"
    for runner in _runner("llama-server-exits-at-start"):
        failed = _failed(runner)
        assert failed["exitCode"] == 1
        assert "exited while starting (exit code 1)" in str(failed["error"])
        assert line not in str(failed["error"])
        r = httpx.post(runner.url + "/v1/chat/completions", json=CHAT, headers=AS_TENANT)
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_unavailable"
        assert line not in r.text
        logs = httpx.get(runner.url + "/v1/models/m/logs", headers={FAIRNESS: "ops"})
        assert any(line in entry for entry in logs.json()["lines"])


def test_engine_never_healthy_fails_after_timeout_with_log() -> None:
    """An engine that never answers health fails after its load timeout, saying so and
    where its log is."""
    for runner in _runner("llama-server-never-healthy", load_timeout_s=2):
        failed = _failed(runner)
        assert "did not become healthy within 2 s" in str(failed["error"])
        assert "GET /v1/models/m/logs" in str(failed["error"])


def test_engine_slow_but_healthy_is_loaded() -> None:
    """An engine answering 'Loading model' for seconds is loaded, not failed."""
    for runner in _runner("llama-server-slow", load_timeout_s=30):
        caps = httpx.get(runner.url + "/v1/capabilities").json()
        assert "m" in [m["id"] for m in caps["models"]["loaded"]]
        assert (
            httpx.post(
                runner.url + "/v1/chat/completions", json=CHAT, headers=AS_TENANT
            ).status_code
            == 200
        )


def test_engine_dies_midstream_client_gets_error_event_and_runner_serves_on() -> None:
    """A crash mid-stream: error event naming the crash, model failed, others still served."""
    for runner in _runner("llama-server-dies-midstream"):
        with httpx.stream(
            "POST",
            runner.url + "/v1/chat/completions",
            json={**CHAT, "stream": True},
            headers=AS_TENANT,
            timeout=30,
        ) as r:
            body = b"".join(r.iter_bytes())
        assert b"engine_crashed" in body or b"engine_unavailable" in body
        deadline = time.monotonic() + 10
        while not _failed(runner) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _failed(runner)["exitCode"] is not None
        assert httpx.get(runner.url + "/health").status_code == 200  # "other" still loaded
        other = httpx.post(
            runner.url + "/v1/chat/completions", json={**CHAT, "model": "other"}, headers=AS_TENANT
        )
        assert other.status_code == 200


def test_engine_killed_with_restart_comes_back() -> None:
    """kill -9 of an engine with restart on: failed, then loaded again by itself."""
    for runner in _runner("llama-server-ok", restart=True):
        # its own engine only: another test's (or another suite's) may run beside it
        children = child_pids(runner.proc.pid) or []
        pids = [pid for pid in _engine_pids("fake_llama_cli fake_openai") if pid in children]
        assert pids
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        seen_failed = False
        while time.monotonic() < deadline:
            caps = httpx.get(runner.url + "/v1/capabilities").json()
            seen_failed |= any(f["id"] == "m" for f in caps["models"]["failed"])
            loaded = [m["id"] for m in caps["models"]["loaded"]]
            if seen_failed and "m" in loaded:
                break
            time.sleep(0.05)
        assert seen_failed and "m" in loaded
        assert (
            httpx.post(
                runner.url + "/v1/chat/completions", json=CHAT, headers=AS_TENANT
            ).status_code
            == 200
        )


def test_engine_floods_logs_runner_keeps_serving_and_logs_are_admin_only() -> None:
    """A flooding engine is served normally; its bounded log is for ADMIN_TENANTS only."""
    for runner in _runner("llama-server-floods-logs"):
        assert (
            httpx.post(
                runner.url + "/v1/chat/completions", json=CHAT, headers=AS_TENANT
            ).status_code
            == 200
        )
        denied = httpx.get(runner.url + "/v1/models/m/logs", headers={FAIRNESS: "guest"})
        assert denied.status_code == 403
        r = httpx.get(runner.url + "/v1/models/m/logs", headers={FAIRNESS: "ops"})
        assert r.status_code == 200
        lines = r.json()["lines"]
        assert 0 < len(lines) <= 500 and max(len(x) for x in lines) <= 4096


@pytest.mark.parametrize("binary", ["llama-server-ok", "llama-server-hangs"])
def test_runner_sigkill_leaves_no_engine(binary: str) -> None:
    """After the runner is killed with SIGKILL, no engine process survives."""
    marker = f"fake_llama_cli {'fake_openai' if binary.endswith('ok') else 'fake_hangs'}"
    for runner in _runner(binary):
        mine = [pid for pid in _engine_pids(marker) if pid in (child_pids(runner.proc.pid) or [])]
        assert mine
        runner.proc.kill()
        runner.proc.wait(10)
        deadline = time.monotonic() + 10
        while set(mine) & set(_engine_pids(marker)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not set(mine) & set(_engine_pids(marker))

"""The runner as a real subprocess (`python -m runner`), configured by env and a models file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.forkserver import Process, spawn
from tests.support.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
LIVE: list[RunnerProcess] = []
"""The runners `start_runner` started in this process that have not been stopped yet: a
failed test's report says of each whether it still runs (tests/conftest.py)."""
LEFT_ON_ERROR: list[str] = []
"""`RunnerProcess.state()` of each runner whose block an exception left (taken before the
runner is killed), for the same report; the report empties it."""


@dataclass
class RunnerProcess:
    proc: Process
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def state(self) -> str:
        """For a failed test's report: where it listens, whether it still runs (a negative
        exit code is the signal that ended it) and its log's end (the log's folder under
        /tmp may be gone by the time the report is read, with the machine CI ran on)."""
        code = self.proc.poll()
        line = f"runner pid {self.proc.pid} on {self.url}: "
        if code is None:
            return line + f"running; log {self.log_path}; its end:\n{self.log()[-2000:]}"
        return line + f"exited with {code}; the end of its log:\n{self.log()[-3000:]}"

    def terminate(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def models_yaml(models: Mapping[str, str], parallel: int | None = None) -> str:
    lines = ["models:"]
    for model_id, url in models.items():
        lines += [f"  - id: {model_id}", "    backend: openai", f"    url: {url}"]
        if parallel is not None:
            lines.append(f"    parallel: {parallel}")
    return ("\n".join(lines) if models else "models: []") + "\n"


@contextmanager
def start_runner(
    models: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    wait_ready: bool = True,
    parallel: int | None = None,
    models_file: str | None = None,
    ready_timeout: float = 20.0,
) -> Iterator[RunnerProcess]:
    """Start `python -m runner` on a free port (forked: tests/support/forkserver.py); SIGKILL
    it if it is still alive at the end.

    `models` maps ids to URLs of running engines; `models_file` is a whole models file
    (YAML) instead, for engines the runner starts itself.
    """
    tmp = Path(tempfile.mkdtemp(prefix="quorum-runner-"))
    port = free_port()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("TENANT_RATE_LIMIT_",))}
    full_env.update(
        {
            "PORT": str(port),
            "HOST": "127.0.0.1",
            "LOG_FORMAT": "text",
            "RUNNER_ID": "test-runner",
            "FAKE_ENGINE_PYTHON": sys.executable,  # tests/fixtures/bin/ stand-ins for engines
            # saved prompt states outlive engines: each runner its own, unless a test shares one
            "PREFIX_CACHE_DIR": str(tmp / "prefixes"),
        }
    )
    path = tmp / "models.yaml"  # never the repository's default models.yaml
    path.write_text(models_file if models_file is not None else models_yaml(models or {}, parallel))
    full_env["MODELS_CONFIG"] = str(path)
    full_env["USAGE_DB"] = str(tmp / "usage.sqlite3")  # never the user's own usage file
    full_env.update(env or {})
    log_path = tmp / "runner.log"
    with open(log_path, "wb") as log:
        proc = spawn("runner", env=full_env, stdout=log, stderr=subprocess.STDOUT)
    runner = RunnerProcess(proc, port, log_path)
    LIVE.append(runner)
    try:
        if wait_ready:
            _wait_healthy(runner, ready_timeout)
        yield runner
    except BaseException:
        LEFT_ON_ERROR.append(runner.state())
        raise
    finally:
        LIVE.remove(runner)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _wait_healthy(runner: RunnerProcess, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if runner.proc.poll() is not None:
            raise RuntimeError(f"runner exited with {runner.proc.returncode}:\n{runner.log()}")
        try:
            if httpx.get(runner.url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"runner not healthy within {timeout}s:\n{runner.log()}")


def wait_started(runner: RunnerProcess, timeout: float = 30.0) -> None:
    """Wait until the runner finished start-up (capabilities answer 200), healthy or not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if runner.proc.poll() is not None:
            raise RuntimeError(f"runner exited with {runner.proc.returncode}:\n{runner.log()}")
        try:
            if httpx.get(runner.url + "/v1/capabilities", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"runner not started within {timeout}s:\n{runner.log()}")


def fixture_bin(name: str) -> str:
    """Path of a stand-in engine executable in tests/fixtures/bin/."""
    return str(REPO_ROOT / "tests" / "fixtures" / "bin" / name)

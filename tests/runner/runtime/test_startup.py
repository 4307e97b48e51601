"""Listen first: the runner answers from its first second while it preloads (runner/http/app.py,
runner/runtime/startup.py), and `Preloads`, the record that gives its Retry-After."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import pytest
import yaml

from runner.runtime.startup import Preloads
from tests.support import real_engines
from tests.support.runner_proc import REPO_ROOT, RunnerProcess, fixture_bin, start_runner

# A stand-in llama-server that answers 503 "Loading model" for 3 s before it serves.
_SLOW_PRELOAD = "\n".join(
    [
        "models:",
        "  - id: m",
        "    backend: llama-server",
        "    path: /dev/null",
        "    preload: true",
        "    vram_mb: 64",
        f"    bin: {fixture_bin('llama-server-slow')}",
    ]
)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _default_llama_model() -> tuple[str, str]:
    """The default models file's preloaded llama-server model (models.yaml: the real
    llama-server and SmolLM2 of scripts/install), alone: its models file and its id."""
    real_engines.llama_server()
    entries = yaml.safe_load((REPO_ROOT / "models.yaml").read_text())["models"]
    entry = next(m for m in entries if m["backend"] == "llama-server" and m.get("preload"))
    return yaml.safe_dump({"models": [entry]}, sort_keys=False), entry["id"]


@dataclass(frozen=True)
class Preload:
    """A models file with one preloaded model, and its id (`real_engine`: a real one)."""

    make: Callable[[], tuple[str, str]]
    real_engine: bool = False


PRELOADS = [
    pytest.param(Preload(lambda: (_SLOW_PRELOAD + "\n", "m")), id="stand-in"),  # loads for 3 s
    pytest.param(Preload(_default_llama_model, real_engine=True), id="llama-server-real"),
]


@dataclass
class Seen:
    at_s: float  # seconds since the runner process was spawned
    health: httpx.Response
    caps: httpx.Response


def _poll_from_spawn(runner: RunnerProcess, deadline_s: float) -> list[Seen]:
    """/health and capabilities, polled from the moment the process starts until both say
    200; a refused connection after the first answer fails the test."""
    spawned = time.monotonic()
    seen: list[Seen] = []
    with httpx.Client(base_url=runner.url, timeout=5) as client:
        while time.monotonic() - spawned < deadline_s:
            assert runner.proc.poll() is None, runner.log()
            try:
                health = client.get("/health")
                caps = client.get("/v1/capabilities")
            except httpx.ConnectError:
                assert not seen, f"connection refused after the port opened:\n{runner.log()}"
                time.sleep(0.02)
                continue
            seen.append(Seen(time.monotonic() - spawned, health, caps))
            if health.status_code == 200 and caps.status_code == 200:
                return seen
            time.sleep(0.05)
    raise AssertionError(f"not ready within {deadline_s}s:\n{runner.log()}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("preload", PRELOADS)
def test_startup_answers_503_starting_with_retry_after_then_200(preload: Preload) -> None:
    """From spawn (`python -m runner` is `quorum serve`), a runner preloading an engine (a
    stand-in that loads for 3 s; the real llama-server with the default model) answers
    /health 503 `starting` and capabilities 503 with Retry-After (the model in
    `models.loading`), then 200 once the model is loaded and it serves a chat; never a
    refused connection after the first answer."""
    models, model = preload.make()
    with start_runner(models_file=models, wait_ready=False) as runner:
        seen = _poll_from_spawn(runner, 45)
        first = seen[0]
        assert first.health.status_code == 503
        assert first.health.json()["status"] == "starting"
        assert int(first.health.headers["Retry-After"]) >= 1
        assert first.caps.status_code == 503
        assert int(first.caps.headers["Retry-After"]) >= 1
        starting = [s for s in seen if s.health.status_code == 503]
        assert all(s.health.json()["status"] == "starting" for s in starting)
        loading = [s.caps.json()["models"]["loading"] for s in starting]
        assert any(entry and entry[0]["id"] == model and entry[0]["eta"] for entry in loading)
        last = seen[-1]
        assert last.health.json()["status"] == "healthy"
        assert "Retry-After" not in last.caps.headers
        assert [m["id"] for m in last.caps.json()["models"]["loaded"]] == [model]
        chat = httpx.post(
            runner.url + "/v1/chat/completions",
            json={**CHAT, "model": model, "max_tokens": 2},
            timeout=30,
        )
        assert chat.status_code == 200
        print(f"first answer {first.at_s:.2f} s after spawn, ready {last.at_s:.2f} s")


@pytest.mark.timeout(60)
def test_startup_inference_while_preloading_is_503_with_retry_after() -> None:
    """A chat request while the runner preloads: 503 with Retry-After, not a refused
    connection and not a hang."""
    with start_runner(models_file=_SLOW_PRELOAD + "\n", wait_ready=False) as runner:
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, runner.log()
            try:
                r = httpx.post(runner.url + "/v1/chat/completions", json=CHAT, timeout=5)
                break
            except httpx.ConnectError:
                time.sleep(0.02)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "service_unavailable"
        assert "starting" in r.json()["error"]["message"]
        assert int(r.headers["Retry-After"]) >= 1


@pytest.mark.timeout(60)
def test_startup_sigterm_while_preloading_exits_zero() -> None:
    """SIGTERM while a model preloads: the load is called off, the runner exits 0."""
    with start_runner(models_file=_SLOW_PRELOAD + "\n", wait_ready=False) as runner:
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, runner.log()
            try:
                health = httpx.get(runner.url + "/health", timeout=5)
                break
            except httpx.ConnectError:
                time.sleep(0.02)
        assert health.json()["status"] == "starting"
        assert runner.terminate(timeout=30) == 0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_preloads_eta_counts_current_load_and_those_ahead() -> None:
    """The time left is the current load's remaining time plus the predictions of the
    models not started yet; Retry-After is it in whole seconds, at least 1."""
    clock = Clock()
    preloads = Preloads("r", clock)
    preloads.plan("a", 10.0)
    preloads.plan("b", 20.0)
    assert preloads.eta_s() == 30.0
    preloads.begin("a")
    clock.now += 4
    assert 25.0 <= preloads.eta_s() <= 27.0
    assert preloads.loading()["a"].eta is not None
    preloads.end()
    preloads.begin("b")
    assert preloads.retry_after_s() == 20
    preloads.end()
    assert preloads.loading() == {}
    assert preloads.retry_after_s() == 1


def test_preloads_overran_load_still_reads_time_left() -> None:
    """A load past its prediction never reads 0 s left while it still runs."""
    clock = Clock()
    preloads = Preloads("r", clock)
    preloads.plan("a", 1.0)
    preloads.begin("a")
    clock.now += 30
    assert preloads.eta_s() > 0
    assert preloads.retry_after_s() >= 1

"""The runner stopped while a real engine serves a stream (docs/reliability.md, sections 8
and 9): SIGKILL leaves no engine process behind, SIGTERM lets the stream finish and then
stops the engine. The engines are the crash contract's real ones
(tests/runner/engines/test_crash_contract.py): llama-server, and vLLM's CPU build, whose API
server forks EngineCore and Worker into its process group (the parent-death signal alone
would leave those running: docs/architecture.md)."""

from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.runner.engines.test_crash_contract import LLAMA, VLLM_REAL
from tests.support.crash_contract import CrashKind, metric
from tests.support.engines import caps, process_group
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, start_runner, wait_started

pytestmark = pytest.mark.timeout(240)

KINDS = [
    pytest.param(LLAMA, id=LLAMA.name),
    pytest.param(VLLM_REAL, id=VLLM_REAL.name, marks=pytest.mark.timeout(900)),
]


def _serving(runner: RunnerProcess, kind: CrashKind) -> list[int]:
    """Wait until `kind`'s model is loaded; the processes of its engine's group."""
    url = runner.url
    wait_started(runner, kind.ready_timeout)
    eventually(lambda: kind.model in [m["id"] for m in caps(url)["models"]["loaded"]],
               kind.ready_timeout, f"{kind.model} loaded")  # fmt: skip
    group = process_group(kind.engine_pid(runner))
    assert group, "the engine's process group is empty"
    return group


def _short_stream(url: str, model: str, started: threading.Event) -> bytes:
    """A 40-token stream, read whole; `started` is set once its first chunk came."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Count slowly to twenty."}],
        "max_tokens": 40,
        "stream": True,
    }
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as s:
        assert s.status_code == 200, s.read()
        chunks = s.iter_bytes()
        first = next(chunks)
        started.set()
        return first + b"".join(chunks)


@pytest.mark.parametrize("kind", KINDS)
def test_runner_sigkill_mid_stream_leaves_no_engine_process(
    kind: CrashKind, tmp_path: Path
) -> None:
    """The runner killed with SIGKILL while its real engine streams an answer: the client's
    connection is cut with no answer, and no process of the engine's process group
    survives (vLLM: its API server, EngineCore and Worker)."""
    env = dict(kind.env(tmp_path))
    with start_runner(
        models_file=kind.models_file(tmp_path, False), env=env, wait_ready=False
    ) as runner:
        group = _serving(runner, kind)
        pgid = kind.engine_pid(runner)
        with ThreadPoolExecutor(1) as pool:
            busy = pool.submit(kind.busy, runner.url)
            eventually(lambda: metric(runner.url, "quorum_requests_in_flight", kind.model) >= 1,
                       60, "the stream in flight")  # fmt: skip
            runner.proc.kill()
            runner.proc.wait(10)
            with pytest.raises(httpx.TransportError):
                busy.result(60)
    eventually(lambda: not process_group(pgid), 15, f"no process of group {pgid} ({group})")
    print(f"{kind.name}: {len(group)} engine processes before the kill, none after")


@pytest.mark.parametrize("kind", KINDS)
def test_runner_sigterm_mid_stream_finishes_it_and_stops_the_engine(
    kind: CrashKind, tmp_path: Path
) -> None:
    """SIGTERM to the runner once its real engine's stream has begun: the stream is answered
    whole ([DONE], no error event), the runner exits 0, and no process of the engine's
    process group is left."""
    env = dict(kind.env(tmp_path))
    with start_runner(
        models_file=kind.models_file(tmp_path, False), env=env, wait_ready=False
    ) as runner:
        group = _serving(runner, kind)
        pgid = kind.engine_pid(runner)
        started = threading.Event()
        with ThreadPoolExecutor(1) as pool:
            streamed = pool.submit(_short_stream, runner.url, kind.model, started)
            assert started.wait(120), "no first chunk"
            runner.proc.send_signal(signal.SIGTERM)
            raw = streamed.result(120)
            code = runner.proc.wait(60)
        log = runner.log()
    assert raw.rstrip().endswith(b"data: [DONE]") and b'"error"' not in raw, raw[-500:]
    assert code == 0, log[-3000:]
    assert not process_group(pgid), (pgid, group, process_group(pgid))

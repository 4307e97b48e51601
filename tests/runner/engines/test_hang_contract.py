"""A spawned engine that hangs is found and treated as a crash (issue 17; docs/reliability.md,
section 5): the engine is frozen with SIGSTOP (it keeps its port, the kernel accepts
connections, nothing answers: a real hang) with one request in flight and two queued.
The runner's probe (runner/engines/watch.py; here every 0.5 s, 1 s each) misses three
answers, kills the engine's process group, and the crash contract follows
(tests/support/crash_contract.py, `HANG`): 502 `engine_crashed` naming the hang for the
request in flight; the queued served after the restart, or 503 `model_unavailable` with
`Retry-After`, the model failed with the hang reason and `/health` 503, without it.

The kinds are the crash contract's (tests/runner/engines/test_crash_contract.py): llama-server and
vLLM real, ComfyUI and vLLM as fakes. A speech worker has no HTTP to probe (its own
channel): not here. And a busy engine is not a hung one: a real llama-server with its one
slot busy answers its probe all along.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.runner.engines.test_crash_contract import (
    COMFYUI,
    LLAMA,
    VLLM,
    VLLM_REAL,
    llama_busy,
)
from tests.support.crash_contract import HANG, CrashKind, metric, outcome, run_crash_contract
from tests.support.engines import caps, processes_with
from tests.support.poll import eventually
from tests.support.runner_proc import start_runner, wait_started

pytestmark = pytest.mark.timeout(240)

CASES = [
    pytest.param(kind, restart, id=f"{kind.name}-{'restart' if restart else 'no-restart'}")
    for kind in (LLAMA, COMFYUI, VLLM)
    for restart in (True, False)
] + [  # the real vLLM starts in minutes on the CPU: one case, no restart to wait for
    pytest.param(VLLM_REAL, False, id="vllm-no-restart", marks=pytest.mark.timeout(900))
]


@pytest.mark.parametrize(("kind", "restart"), CASES)
def test_hang_contract_sigstop_with_one_in_flight_and_two_queued(
    kind: CrashKind, restart: bool, tmp_path: Path
) -> None:
    """SIGSTOP of the engine (the one process whose probe is asked: vLLM's API server, not
    the EngineCore it forked): three probes missed, the runner kills its process group;
    the request in flight gets 502 engine_crashed naming the hang ("hung: stopped
    answering ...; killed by the runner"), the two queued are served after the restart
    (`restart: true`) or get 503 model_unavailable naming it, with Retry-After, the model
    failed in capabilities with that reason and /health 503 (`restart: false`);
    quorum_engine_hangs_total 1."""
    run_crash_contract(kind, restart, tmp_path, HANG)


def _port(argv: list[str]) -> int:
    return int(argv[argv.index("--port") + 1])


@pytest.mark.timeout(480)  # 300 tokens: seconds when quiet, minutes beside a vLLM
@pytest.mark.usefixtures("real_llama_server")
def test_hang_contract_busy_llama_server_answers_its_probe_and_is_kept(tmp_path: Path) -> None:
    """A real llama-server with its one slot busy (a long stream) answers `/health` at once,
    from its HTTP thread, every time it is asked while it generates; the runner, probing it
    every 0.5 s with a 1 s timeout, keeps it: the stream ends whole, no hang, no crash."""
    env = {**HANG.env, "ENGINE_READ_TIMEOUT_S": "120"}
    with start_runner(models_file=LLAMA.models_file(tmp_path, False), env=env,
                      wait_ready=False) as runner:  # fmt: skip
        wait_started(runner, LLAMA.ready_timeout)
        url = runner.url
        eventually(lambda: "gemma" in [m["id"] for m in caps(url)["models"]["loaded"]],
                   LLAMA.ready_timeout, "gemma loaded")  # fmt: skip
        [(_pid, argv)] = [p for p in processes_with(parent=runner.proc.pid) if "--port" in p[1]]
        health = f"http://127.0.0.1:{_port(argv)}/health"
        with ThreadPoolExecutor(1) as pool:
            busy = pool.submit(llama_busy, url, max_tokens=300)
            eventually(lambda: metric(url, "quorum_requests_in_flight", "gemma") >= 1,
                       60, "the busy request in flight")  # fmt: skip
            answered = 0
            while True:  # asked again each 0.5 s the stream goes on, as the runner asks
                probe = httpx.get(health, timeout=1.0)
                assert probe.status_code == 200, probe.text
                answered += 1
                try:
                    streamed = busy.result(0.5)
                except TimeoutError:
                    continue
                break
        hangs = metric(url, "quorum_engine_hangs_total", "gemma")
        crashes = metric(url, "quorum_engine_crashes_total", "gemma")
        loaded = [m["id"] for m in caps(url)["models"]["loaded"]]
    assert answered >= 6, f"the stream lasted {answered} probes: too short to show anything"
    done = outcome(streamed)
    assert done.status == 200 and done.error is None, done
    assert re.search(rb"data: \[DONE\]", streamed.content), streamed.content[-300:]
    assert (hangs, crashes, loaded) == (0.0, 0.0, ["gemma"])

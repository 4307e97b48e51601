"""The crash contract, one test shape for every engine kind the runner starts.

`run_crash_contract(kind, restart, tmp)`: a runner serving one model (`parallel: 1`) of
`kind`, one request in flight and two queued behind it; the engine process is killed with
SIGKILL. What each request gets (docs/reliability.md):

- the one in flight: 502 `engine_crashed` naming the signal (a stream: the SSE error
  event with that code);
- the two queued, `restart: true`: they keep waiting and the restarted engine serves them;
- the two queued, `restart: false`: 503 `model_unavailable` naming the signal, with
  `Retry-After`; never a generic 502; the model reads failed in capabilities naming it
  (`exitCode` -9), and `/health` agrees (503 `unhealthy`: no other model).

The same shape for a hang (`fault=HANG`): the engine is frozen with SIGSTOP, so it keeps
its port and never answers; the runner's probe (runner/engines/watch.py, at a short interval
here) finds it and kills it, and every answer above names the hang instead of the signal
(`quorum_engine_hangs_total` 1).

A `CrashKind` says how to configure, find and load one engine kind; adding one (the real
vLLM, say) is one more `CrashKind` in the parametrization, nothing else.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.support.engines import caps
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, start_runner, wait_started


@dataclass(frozen=True)
class CrashKind:
    """One engine kind as the crash contract drives it.

    `models_file(tmp, restart)`: a models file with one model `model` (parallel 1,
    preloaded, `restart` as given). `engine_pid(runner)`: the engine process serving it.
    `busy(url)`: a request that keeps the engine busy for seconds (read whole, streams
    too). `quick(url, tenant)`: a short request. `env(tmp)`: the runner's settings.
    `real_engine`: the kind is a real engine, so a test it parametrizes is marked
    `real_engine` (tests/conftest.py) and runs in the full tier only; `real_vllm`: the kind
    is the real vLLM, so the test runs in the vLLM group (one vLLM at a time,
    tests/support/real_engines.py `xdist_group`).
    """

    name: str
    model: str
    models_file: Callable[[Path, bool], str]
    engine_pid: Callable[[RunnerProcess], int]
    busy: Callable[[str], httpx.Response]
    quick: Callable[[str, str], httpx.Response]
    env: Callable[[Path], Mapping[str, str]] = lambda _tmp: {}
    ready_timeout: float = 60.0
    real_engine: bool = False
    real_vllm: bool = False


@dataclass(frozen=True)
class Fault:
    """What is done to the engine process: `sig`, with the runner's `env`; what the
    in-flight error's message and the refusals' reason then name (`names`), and how many
    hangs `/metrics` counts for the model (`hangs`)."""

    sig: signal.Signals
    names: str
    hangs: int
    env: Mapping[str, str] = field(default_factory=dict)


SIGKILL = Fault(signal.SIGKILL, "SIGKILL", 0)
HANG = Fault(
    signal.SIGSTOP,
    "hung: stopped answering",
    1,
    {"ENGINE_STATS_INTERVAL_S": "0.5", "ENGINE_PROBE_TIMEOUT_S": "1"},
)


@dataclass(frozen=True)
class Outcome:
    """What a client got: the status (an SSE error event counts as 502), the error object
    (None on success), and Retry-After."""

    status: int
    error: dict[str, Any] | None
    retry_after: str | None


def outcome(r: httpx.Response) -> Outcome:
    """A whole answer, or a stream that ended with an error event, as an `Outcome`."""
    retry = r.headers.get("retry-after")
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        for line in r.content.split(b"\n"):
            if line.startswith(b"data: {") and b'"error"' in line:
                return Outcome(502, orjson.loads(line[6:])["error"], retry)
        return Outcome(r.status_code, None, retry)
    if r.status_code == 200:
        return Outcome(200, None, retry)
    return Outcome(r.status_code, r.json().get("error"), retry)


def metric(url: str, name: str, model: str) -> float:
    """The runner's `/metrics` sample `name` for `model` (0 when absent)."""
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _busy_and_two_queued(runner: RunnerProcess, kind: CrashKind) -> bool:
    """One request in flight and two queued. A status read that times out is "not yet":
    with a real engine busy on two cores and the other test worker beside it, CI once saw
    one `/health` answer take over 10 s (never reproduced here: under three busy loops
    beside vLLM the slowest was 0.5 s); the wait's own deadline still bounds it."""
    url = runner.url
    try:
        in_flight = metric(url, "quorum_requests_in_flight", kind.model)
        depth = httpx.get(url + "/health", timeout=10).json()["queueDepth"]
    except httpx.TimeoutException:
        return False
    return in_flight >= 1 and depth >= 2


def run_crash_contract(kind: CrashKind, restart: bool, tmp: Path, fault: Fault = SIGKILL) -> None:
    """`fault` (SIGKILL, or a hang) on `kind`'s engine with one request in flight and two
    queued (module doc)."""
    models = kind.models_file(tmp, restart)
    env = {**kind.env(tmp), **fault.env}
    with start_runner(
        models_file=models, env=env, wait_ready=False, ready_timeout=kind.ready_timeout
    ) as runner:
        wait_started(runner, kind.ready_timeout)
        url, model = runner.url, kind.model
        eventually(lambda: model in [m["id"] for m in caps(url)["models"]["loaded"]],
                   kind.ready_timeout, f"{model} loaded")  # fmt: skip
        pid = kind.engine_pid(runner)
        with ThreadPoolExecutor(3) as pool:
            busy = pool.submit(kind.busy, url)
            eventually(lambda: metric(url, "quorum_requests_in_flight", model) >= 1,
                       60, "the busy request in flight")  # fmt: skip
            queued: list[Future[httpx.Response]] = [
                pool.submit(kind.quick, url, f"queued-{i}") for i in range(2)
            ]
            eventually(lambda: _busy_and_two_queued(runner, kind), 60, "two requests queued")
            os.kill(pid, fault.sig)
            crashed = outcome(busy.result(120))
            # served after a restart: as long as the engine takes to start again
            answers = [outcome(f.result(kind.ready_timeout + 120)) for f in queued]
        hangs = metric(url, "quorum_engine_hangs_total", model)
        failed = {f["id"]: f for f in caps(url)["models"]["failed"]}
        health = httpx.get(url + "/health", timeout=10)
        log = runner.log()
    assert crashed.status == 502, (kind.name, crashed, log[-3000:])
    assert crashed.error is not None and crashed.error["code"] == "engine_crashed", crashed
    assert fault.names in crashed.error["message"], crashed
    assert hangs == fault.hangs, (kind.name, hangs)
    if not restart:
        assert fault.names in failed[model]["error"], failed
        assert failed[model]["exitCode"] == -9, failed
        assert (health.status_code, health.json()["status"]) == (503, "unhealthy"), health.text
    for answer in answers:
        if restart:  # served by the restarted engine
            assert answer.status == 200, (kind.name, answer, log[-3000:])
            continue
        assert answer.status == 503, (kind.name, answer, log[-3000:])
        assert answer.error is not None and answer.error["code"] == "model_unavailable", answer
        assert fault.names in answer.error["reason"], answer
        assert answer.retry_after is not None and int(answer.retry_after) > 0, answer

"""Requests queued when SIGTERM arrives (docs/reliability.md, section 8): served while the
grace (SHUTDOWN_GRACE_S) lasts; still waiting when it is nearly over, refused with 503
`shutting_down` and `Retry-After`, never uvicorn's bare 500 for a cancelled request."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest

from tests.fixtures.launch import start_fake
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(60)

STREAM = {"model": "echo", "stream": True, "messages": [{"role": "user", "content": "x"}]}
QUICK = {"model": "echo", "messages": [{"role": "user", "content": "q"}]}


@contextmanager
def _one_slot(chunks: int, delay_ms: int, grace_s: float) -> Iterator[RunnerProcess]:
    fake = ("--latency-ms", "0", "--chunks", str(chunks), "--chunk-delay-ms", str(delay_ms))
    env = {"SHUTDOWN_GRACE_S": str(grace_s)}
    with (
        start_fake("fake_openai", *fake) as engine,
        start_runner({"echo": engine.url}, parallel=1, env=env) as runner,
    ):
        yield runner


def _queued(url: str) -> bool:
    return bool(httpx.get(url + "/health", timeout=5).json()["queueDepth"] >= 1)


def test_sigterm_queued_request_is_served_within_the_grace() -> None:
    """The one slot streams (1 s), one request waits; SIGTERM: the stream ends with
    [DONE], the queued request is served, the runner exits 0."""
    with _one_slot(chunks=20, delay_ms=50, grace_s=30) as runner, ThreadPoolExecutor(1) as pool:
        with httpx.stream("POST", runner.url + "/v1/chat/completions", json=STREAM) as s:
            chunks = s.iter_raw()
            next(chunks)
            waiting = pool.submit(
                httpx.post, runner.url + "/v1/chat/completions", json=QUICK, timeout=30
            )
            eventually(lambda: _queued(runner.url), 10, "a queued request")
            runner.proc.send_signal(signal.SIGTERM)
            rest = b"".join(chunks)
        assert rest.rstrip().endswith(b"data: [DONE]")
        assert waiting.result(30).status_code == 200
        assert runner.proc.wait(30) == 0


def test_sigterm_request_still_queued_at_the_end_of_the_grace_is_503() -> None:
    """The one slot streams for 6 s, one request waits; SIGTERM with a 2 s grace: the
    queued request gets 503 `shutting_down` with Retry-After in the envelope (not a 500),
    the runner exits 0."""
    with _one_slot(chunks=60, delay_ms=100, grace_s=2) as runner, ThreadPoolExecutor(1) as pool:
        with httpx.stream("POST", runner.url + "/v1/chat/completions", json=STREAM) as s:
            chunks = s.iter_raw()
            next(chunks)
            waiting = pool.submit(
                httpx.post, runner.url + "/v1/chat/completions", json=QUICK, timeout=30
            )
            eventually(lambda: _queued(runner.url), 10, "a queued request")
            runner.proc.send_signal(signal.SIGTERM)
            refused = waiting.result(30)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "shutting_down"
        assert int(refused.headers["Retry-After"]) >= 1
        assert runner.proc.wait(30) == 0

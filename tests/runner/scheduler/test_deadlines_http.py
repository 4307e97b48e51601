"""Deadlines through HTTP, on a real runner process in front of a stand-in engine."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.fixtures.launch import FakeEngine, start_fake
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(60)

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def one_second_streams() -> Iterator[FakeEngine]:
    """JSON answers at once; a stream lasts about 1 s (10 chunks, 100 ms apart)."""
    with start_fake(
        "fake_openai", "--latency-ms", "0", "--chunks", "10", "--chunk-delay-ms", "100"
    ) as engine:
        yield engine


def _stream(runner: RunnerProcess, content: str) -> int:
    """One whole stream; its status."""
    body = {**CHAT, "stream": True, "messages": [{"role": "user", "content": content}]}
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", runner.url + "/v1/chat/completions", json=body) as resp,
    ):
        resp.read()
        return resp.status_code


def _post(runner: RunnerProcess, content: str, headers: dict[str, str]) -> httpx.Response:
    body = {**CHAT, "messages": [{"role": "user", "content": content}]}
    return httpx.post(runner.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def _seen(engine: FakeEngine) -> list[str]:
    """The prompts the engine received, in order."""
    return [body["messages"][0]["content"] for body in engine.bodies("/v1/chat/completions")]


def test_unreachable_deadline_is_refused_at_once_with_forecast(
    one_second_streams: FakeEngine,
) -> None:
    """With the one slot streaming (about 1 s measured per request), a 100 ms deadline is
    answered 503 deadline_unreachable at once, with the forecast and Retry-After."""
    with (
        start_runner({"echo": one_second_streams.url}, parallel=1) as r,
        ThreadPoolExecutor(1) as pool,
    ):
        assert _stream(r, "warm-up") == 200  # measures the service time
        blocker = pool.submit(_stream, r, "blocker")
        eventually(lambda: _seen(one_second_streams) == ["warm-up", "blocker"])
        started = time.monotonic()
        refused = _post(r, "hurried", {"X-Request-Deadline-Ms": "100"})
        took = time.monotonic() - started
        assert blocker.result() == 200
    assert refused.status_code == 503 and took < 0.5
    error = refused.json()["error"]
    assert error["code"] == "deadline_unreachable"
    assert error["deadlineMs"] == 100 and 100 < error["forecastWaitMs"] <= 1500
    assert int(refused.headers["retry-after"]) >= 1
    assert _seen(one_second_streams) == ["warm-up", "blocker"]


def test_queued_request_whose_deadline_passes_never_reaches_the_engine(
    one_second_streams: FakeEngine,
) -> None:
    """Nothing measured yet, so a 300 ms deadline is admitted behind a 1 s stream; when it
    passes the request is answered 504 deadline_exceeded (llm-d's header) and the engine
    never sees it."""
    with (
        start_runner({"echo": one_second_streams.url}, parallel=1) as r,
        ThreadPoolExecutor(1) as pool,
    ):
        blocker = pool.submit(_stream, r, "blocker")
        eventually(lambda: _seen(one_second_streams) == ["blocker"])
        started = time.monotonic()
        late = _post(r, "doomed", {"x-llm-d-slo-ttft-ms": "300"})
        took = time.monotonic() - started
        assert blocker.result() == 200
    assert late.status_code == 504 and 0.3 <= took < 0.9
    error = late.json()["error"]
    assert error["code"] == "deadline_exceeded" and error["deadlineMs"] == 300
    assert "retry-after" not in late.headers
    assert _seen(one_second_streams) == ["blocker"]


def test_forecast_published_in_capabilities_and_gauges(one_second_streams: FakeEngine) -> None:
    """While the one slot streams, capabilities and /metrics forecast a new request's wait
    (what is left of the stream in flight), per priority and per model."""
    with (
        start_runner({"echo": one_second_streams.url}, parallel=1) as r,
        ThreadPoolExecutor(1) as pool,
    ):
        assert _stream(r, "warm-up") == 200
        blocker = pool.submit(_stream, r, "blocker")
        eventually(lambda: _seen(one_second_streams) == ["warm-up", "blocker"])
        queue = httpx.get(r.url + "/v1/capabilities").json()["queue"]
        metrics = httpx.get(r.url + "/metrics").text
        assert blocker.result() == 200
    assert set(queue["forecastWaitMs"]) == {"high", "normal", "low"}
    assert 0 < queue["forecastWaitMs"]["normal"] <= 1500
    assert queue["forecastWaitMsByModel"]["echo"] == queue["forecastWaitMs"]
    gauge = 'quorum_model_queue_forecast_wait_seconds{model="echo",priority="normal"} '
    line = next(x for x in metrics.splitlines() if x.startswith(gauge))
    assert 0 < float(line.removeprefix(gauge)) <= 1.5
    assert 'quorum_queue_forecast_wait_seconds{priority="high"}' in metrics

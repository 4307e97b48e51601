"""A request's deadline (`X-Request-Deadline-Ms`) once it is granted: what is left of it
bounds the engine's work until the answer's first byte (runner/http/deadline.py), so a
client that says how long it waits is answered within that time however slow the engine
and however long `ENGINE_READ_TIMEOUT_S` (issue 37: the chaos soak's two requests to the
real llama-server, slow on two shared cores, that had no answer within the client's 60 s)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import httpx
import pytest

from tests.fixtures.launch import FakeEngine, start_fake
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(120)

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
CLIENT_WAITS_S = 20.0  # far below the runner's ENGINE_READ_TIMEOUT_S: the soak's shape


@dataclass
class Setup:
    runner: RunnerProcess
    hangs: FakeEngine
    slow: FakeEngine


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    with ExitStack() as stack:
        hangs = stack.enter_context(start_fake("fake_hangs"))
        slow = stack.enter_context(start_fake("fake_openai", "--latency-ms", "1500"))
        runner = stack.enter_context(
            start_runner(
                {"hangs": hangs.url, "slow": slow.url},
                env={"ENGINE_READ_TIMEOUT_S": "300", "ENGINE_STATS_INTERVAL_S": "3600"},
                parallel=1,
            )
        )
        yield Setup(runner, hangs, slow)


def _post(setup: Setup, model: str, deadline_ms: int | None, **extra: object) -> httpx.Response:
    headers = {"X-Request-Deadline-Ms": str(deadline_ms)} if deadline_ms is not None else {}
    return httpx.post(
        setup.runner.url + "/v1/chat/completions",
        json={**CHAT, "model": model, **extra},
        headers=headers,
        timeout=CLIENT_WAITS_S,
    )


def _arrived(engine: FakeEngine) -> int:
    stats = httpx.get(engine.url + "/_fake/stats", timeout=5).json()
    return int(stats["by_path"].get("/v1/chat/completions", 0))


def test_engine_deadline_passed_at_the_engine_is_504_not_silence(setup: Setup) -> None:
    """A granted request whose engine has not answered when its deadline passes gets 504
    `deadline_exceeded` then, not silence until ENGINE_READ_TIMEOUT_S."""
    before = _arrived(setup.hangs)
    r = _post(setup, "hangs", 1500)
    assert r.status_code == 504, r.text
    error = r.json()["error"]
    assert error["code"] == "deadline_exceeded"
    assert error["deadlineMs"] == 1500
    assert "retry-after" not in r.headers  # the client's own deadline passed
    assert _arrived(setup.hangs) == before + 1  # it reached the engine: cut there


def test_engine_deadline_passed_before_a_streams_first_chunk_is_504(setup: Setup) -> None:
    """A stream whose first chunk has not come when its deadline passes gets 504 before
    any header of a 200."""
    r = _post(setup, "hangs", 1500, stream=True)
    assert r.status_code == 504, r.text
    assert r.json()["error"]["code"] == "deadline_exceeded"


def test_engine_deadline_cut_frees_the_slot_for_the_next_request(setup: Setup) -> None:
    """After a cut at the engine the model's one slot is free again: the next request
    reaches the engine (and is cut there in turn), it does not wait behind the first."""
    before = _arrived(setup.hangs)
    assert _post(setup, "hangs", 1000).status_code == 504
    second = _post(setup, "hangs", 1000)
    assert second.status_code == 504, second.text
    eventually(lambda: _arrived(setup.hangs) == before + 2, timeout=10)


def test_engine_deadline_an_answer_in_time_is_untouched(setup: Setup) -> None:
    """An engine that answers within the deadline is answered 200, as one with no
    deadline at all."""
    assert _post(setup, "slow", 15_000).status_code == 200
    assert _post(setup, "slow", None).status_code == 200

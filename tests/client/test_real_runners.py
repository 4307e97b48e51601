"""The client against real runner processes in different states: `pick`, fall-over, loads,
the OpenAI SDK helper."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from client import (
    LoadCancelled,
    LoadFailed,
    LoadProgress,
    Reach,
    Runner,
    RunnerPool,
    parse_token,
)
from tests.support.fleet import full_queue, load_token, loaded, loading, runner
from tests.support.poll import eventually
from tests.support.tokens import dev_token

pytestmark = pytest.mark.timeout(180)


class Clock:
    """The pool's clock, moved by the test so the 5 s capabilities cache expires on cue."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_pick_among_three_runners_and_fall_over_when_one_is_killed() -> None:
    """Loaded beats loading beats full; with the loaded runner killed mid-test the chat
    falls over to the loading one and waits there for the load; the dead runner is then
    marked unreachable with its last good view kept."""
    with (
        runner("runner-a", "llama-server-ok", preload=True) as a,
        runner("runner-b", "llama-server-slower") as b,
        runner("runner-c", "llama-server-paced-long", preload=True,
               env={"MAX_QUEUE_DEPTH": "2"}) as c,
        full_queue(c, waiting=2) as queued,
        ThreadPoolExecutor(1) as background,
    ):  # fmt: skip
        seen: list[LoadProgress] = []
        rb = Runner(b.url)
        token = parse_token(load_token("runner-b"))
        loading_b = background.submit(rb.load, token, progress=seen.append, interval_s=0.2)
        eventually(lambda: "m" in loading(b))
        clock = Clock()
        with RunnerPool([c.url, b.url, a.url], tenant="acme", clock=clock) as pool:
            choice = pool.pick("m")
            assert choice.url == a.url
            assert [x.url for x in choice.ranking] == [a.url, b.url, c.url]
            assert [(x.model_state, x.full) for x in choice.ranking] == [
                ("loaded", False),
                ("loading", False),
                ("loaded", True),
            ]
            assert choice.reason.startswith(f"m on {a.url} (loaded")

            a.proc.kill()
            a.proc.wait(10)
            answer = pool.chat("m", [{"role": "user", "content": "hi"}], deadline_s=60)
            assert answer.url == b.url
            assert answer.json()["choices"][0]["message"]["content"] == "echo: hi"
            assert int(answer.headers["x-queue-wait-ms"]) > 0  # it waited for b's load
            assert [(t.url, t.status, t.code) for t in answer.attempts] == [
                (a.url, None, "unreachable"),
                (b.url, 200, None),
            ]
            clock.now += 5.0
            pool.refresh()
            dead = pool.state(a.url)
            assert dead.reach is Reach.UNREACHABLE and dead.view is not None
            assert dead.view.runner_id == "runner-a" and dead.age(clock.now) == 5.0
            assert pool.state(b.url).reach is Reach.UP

        result = loading_b.result(30)
        rb.close()
        assert result.model_id == "m" and result.url == b.url
        statuses = [p.status for p in seen]
        assert statuses[0] == "accepted" and "loading" in statuses and statuses[-1] == "completed"
        assert all(p.eta is not None for p in seen)
        assert [p.progress for p in seen] == sorted(p.progress for p in seen)
    assert all(f.result().status_code == 200 for f in queued)


def test_chat_falls_over_when_the_chosen_runner_answers_503() -> None:
    """The pool chose runner c (idle when it looked); c's queue has filled since, so c
    answers 503 queue_full with Retry-After and the chat is served by runner d."""
    with (
        runner("runner-c", "llama-server-paced-long", preload=True,
               env={"MAX_QUEUE_DEPTH": "1", "RUNNER_MEMORY_MB": "64000"}) as c,
        runner("runner-d", "llama-server-ok", preload=True,
               env={"RUNNER_MEMORY_MB": "300"}) as d,
        RunnerPool([d.url, c.url], tenant="acme", priority="high") as pool,
    ):  # fmt: skip
        choice = pool.pick("m")
        assert choice.url == c.url and "more free memory" in choice.reason, choice.reason
        with full_queue(c, waiting=1):
            answer = pool.chat("m", [{"role": "user", "content": "hi"}], max_tokens=8)
            assert answer.url == d.url and answer.status == 200
            first = answer.attempts[0]
            assert (first.url, first.status, first.code) == (c.url, 503, "queue_full")
            assert first.retry_after is not None and first.retry_after >= 1
            assert {"x-queue-wait-ms", "x-cache-hit", "x-gpu-time-ms"} <= set(answer.headers)
            assert pool.state(c.url).retry_after_s(pool.clock()) > 0


def test_load_failure_raises_the_task_error() -> None:
    """A load whose engine exits at start ends `failed`: LoadFailed carries the task's error."""
    with runner("runner-x", "llama-server-exits-at-start") as x, Runner(x.url) as rx:
        seen: list[str] = []
        with pytest.raises(LoadFailed) as raised:
            rx.load(parse_token(load_token("runner-x")), progress=lambda p: seen.append(p.status))
        assert raised.value.task_id.startswith("load-") and raised.value.model_id == "m"
        assert "exit" in raised.value.error
        assert seen[-1] == "failed"


def test_openai_sdk_and_helpers_through_the_pool() -> None:
    """The pool hands out an openai.OpenAI client for the picked runner (chat, streaming);
    completions and embeddings go through the pool's own helpers."""
    with (
        runner("runner-a", "llama-server-ok", preload=True) as a,
        RunnerPool([a.url], tenant="acme", priority="low") as pool,
    ):
        sdk = pool.openai_client("m")
        reply = sdk.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hello"}]
        )
        assert reply.parse().choices[0].message.content == "echo: hello"
        assert reply.headers["x-cache-hit"] in ("true", "false")
        chunks = sdk.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True
        )
        assert "tok0" in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        sdk.close()
        assert pool.completions("m", "The sky is", max_tokens=4).json()["choices"]
        assert len(pool.embeddings("m", "text").json()["data"][0]["embedding"]) == 8
        assert "m" in loaded(a)


def test_cancel_load_with_a_token_for_its_task() -> None:
    """A running load is stopped with a task-cancel token signed for the task id the first
    progress report named; the load being followed then raises LoadCancelled."""
    with runner("runner-b", "llama-server-slower") as b, Runner(b.url) as rb:
        first: list[LoadProgress] = []
        with ThreadPoolExecutor(1) as background:
            following = background.submit(
                rb.load, parse_token(load_token("runner-b")), progress=first.append, interval_s=0.2
            )
            eventually(lambda: bool(first))
            task = first[0].task_id
            cancel = parse_token(dev_token("task-cancel", "m", {"taskId": task}, aud="runner-b"))
            with Runner(b.url) as other:
                assert other.cancel_load(task, cancel).status == "cancelled"
            with pytest.raises(LoadCancelled) as raised:
                following.result(30)
        assert raised.value.task_id == task
        assert "m" not in loaded(b)

"""Scheduling, rate limits and backpressure seen through HTTP, on real runner processes."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.fixtures.launch import FakeEngine, start_fake
from tests.support.poll import eventually
from tests.support.redis_server import RedisServer
from tests.support.runner_proc import RunnerProcess, start_runner

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


def _queue_depth(runner: RunnerProcess) -> int:
    depth: int = httpx.get(runner.url + "/health").json()["queueDepth"]
    return depth


@pytest.fixture
def slow_engine() -> Iterator[FakeEngine]:
    """JSON answers at once; a stream lasts 10 s unless its client goes away."""
    with start_fake(
        "fake_openai", "--latency-ms", "0", "--chunks", "50", "--chunk-delay-ms", "200"
    ) as engine:
        yield engine


@contextmanager
def blocking_stream(runner: RunnerProcess, engine: FakeEngine) -> Iterator[None]:
    """Hold the model's only slot with a long stream until the block ends (then hang up)."""
    body = {**CHAT, "stream": True, "messages": [{"role": "user", "content": "blocker"}]}
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", runner.url + "/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        chunks = resp.iter_raw()  # keep a reference: dropping it would hang up at once
        next(chunks)
        yield


def _post(runner: RunnerProcess, headers: dict[str, str], content: str = "hi") -> httpx.Response:
    body = {**CHAT, "messages": [{"role": "user", "content": content}]}
    return httpx.post(runner.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def _prompts(engine: FakeEngine) -> list[str]:
    """The chat prompts the engine received, in order (its probes are not in them)."""
    return [body["messages"][0]["content"] for body in engine.bodies("/v1/chat/completions")]


def test_high_priority_overtakes_ten_low_when_model_is_full(
    slow_engine: FakeEngine, tmp_path: Path
) -> None:
    """With the model's one slot busy, a high request sent after ten low ones is served
    first (where the tenants file lets requests ask for `high`)."""
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text("defaults:\n  priority: {max: high}\ntenants: {}\n")
    env = {"MAX_QUEUE_DEPTH": "32", "TENANTS_FILE": str(tenants)}
    with (
        start_runner({"echo": slow_engine.url}, parallel=1, env=env) as r,
        ThreadPoolExecutor(11) as pool,
    ):
        with blocking_stream(r, slow_engine):
            futures = [pool.submit(_post, r, {"X-Priority": "low"}, f"low{i}") for i in range(10)]
            eventually(lambda: _queue_depth(r) == 10)
            futures.append(pool.submit(_post, r, {"X-Priority": "high"}, "high"))
            eventually(lambda: _queue_depth(r) == 11)
        assert all(f.result().status_code == 200 for f in futures)
        order = _prompts(slow_engine)
        assert order[:2] == ["blocker", "high"]
        assert sorted(order[2:]) == sorted(f"low{i}" for i in range(10))


def test_queue_full_is_503_with_seed_body_and_retry_after(slow_engine: FakeEngine) -> None:
    """Beyond MAX_QUEUE_DEPTH waiting requests the runner answers 503 queue_full + Retry-After."""
    with (
        # `late` is declared (an env limit), so /metrics names it; undeclared ids read `_other`
        start_runner(
            {"echo": slow_engine.url},
            parallel=1,
            env={"MAX_QUEUE_DEPTH": "2", "TENANT_RATE_LIMIT_late": "unlimited"},
        ) as r,
        ThreadPoolExecutor(2) as pool,
    ):
        with blocking_stream(r, slow_engine):
            waiting = [pool.submit(_post, r, {}) for _ in range(2)]
            eventually(lambda: _queue_depth(r) == 2)
            assert httpx.get(r.url + "/health").json()["status"] == "saturated"
            refused = _post(r, {"X-Tenant-ID": "late"})
        assert refused.status_code == 503
        error = refused.json()["error"]
        assert error["code"] == "queue_full"
        assert error["queueDepth"] == 2 and "avgWaitMs" in error
        assert "2/2" in error["message"]
        assert int(refused.headers["retry-after"]) >= 1
        assert all(f.result().status_code == 200 for f in waiting)
        metrics = httpx.get(r.url + "/metrics").text
        assert 'quorum_rejections_total{reason="queue_full",tenant="late"} 1.0' in metrics


def test_tenant_rate_limit_from_env_is_honoured() -> None:
    """TENANT_RATE_LIMIT_community-x=5req/min: five pass, the sixth is 429 with the seed's body."""
    with (
        start_fake("fake_openai", "--latency-ms", "0") as engine,
        start_runner({"echo": engine.url}, env={"TENANT_RATE_LIMIT_community-x": "5req/min"}) as r,
    ):
        tenant = {"X-Tenant-ID": "community-x"}
        oks = [_post(r, tenant) for _ in range(5)]
        assert [o.status_code for o in oks] == [200] * 5
        assert [o.headers["ratelimit-remaining"] for o in oks] == ["4", "3", "2", "1", "0"]
        assert all(o.headers["ratelimit-limit"] == "5" for o in oks)
        refused = _post(r, tenant)
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert error["code"] == "rate_limit_exceeded"
        assert error["limit"] == 5 and error["remaining"] == 0
        assert error["resetAt"] > time.time()
        assert "community-x" in error["message"]
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["ratelimit-remaining"] == "0"
        assert _post(r, {"X-Tenant-ID": "other"}).status_code == 200  # other tenants unaffected
        stream = {**CHAT, "stream": True}
        with httpx.stream(
            "POST", r.url + "/v1/chat/completions", json=stream, headers={"X-Tenant-ID": "streamer"}
        ) as streamed:
            assert streamed.status_code == 200
            assert "ratelimit-limit" not in streamed.headers  # "streamer" has no limit

        assert engine.received("/v1/chat/completions") == 7


def test_two_runners_sharing_redis_enforce_one_limit(redis_server: RedisServer) -> None:
    """Two runner processes on one Redis let exactly 10 of 30 requests through at 10 req/min."""
    env = {
        "REDIS_URL": redis_server.url,
        "TENANT_RATE_LIMIT_shared": "10req/min",
        # the shared window is pinned here, not Redis' speed: on a loaded 2-core machine
        # the default 250 ms once let a request fail open (11 of 30 admitted)
        "RATE_LIMIT_STORE_TIMEOUT_MS": "5000",
    }
    with (
        start_fake("fake_openai", "--latency-ms", "0") as engine,
        start_runner({"echo": engine.url}, env=env) as a,
        start_runner({"echo": engine.url}, env=env) as b,
        ThreadPoolExecutor(6) as pool,
    ):
        runners = [a, b] * 15
        results = list(pool.map(lambda r: _post(r, {"X-Tenant-ID": "shared"}), runners))
        codes = [res.status_code for res in results]
        assert codes.count(200) == 10
        assert codes.count(429) == 20
        assert engine.received("/v1/chat/completions") == 10


def test_client_disconnect_while_queued_never_reaches_engine(slow_engine: FakeEngine) -> None:
    """A client that gives up while queued is withdrawn; the engine never sees its request."""
    with start_runner({"echo": slow_engine.url}, parallel=1) as r:
        with blocking_stream(r, slow_engine):
            body = {**CHAT, "messages": [{"role": "user", "content": "impatient"}]}
            with (
                httpx.Client(timeout=httpx.Timeout(30, read=0.2)) as client,
                pytest.raises(httpx.ReadTimeout),
            ):
                client.post(r.url + "/v1/chat/completions", json=body)
            eventually(lambda: _queue_depth(r) == 0)
        assert _post(r, {}, "after").status_code == 200
        seen = _prompts(slow_engine)
        assert seen == ["blocker", "after"]


def test_client_gone_midstream_frees_the_slot_before_the_engine_ends(
    slow_engine: FakeEngine,
) -> None:
    """A client that hangs up in the middle of a stream has its handler cancelled at once
    (the connection tells it, runner/http/limits.py): the slot is free long before the
    engine's 10 s stream would have ended, and the next request is served."""
    with start_runner({"echo": slow_engine.url}, parallel=1) as r:
        with blocking_stream(r, slow_engine):
            eventually(lambda: _running(r) == 1)
        eventually(lambda: _running(r) == 0, timeout=5.0)
        assert _post(r, {}, "after").status_code == 200


def _running(runner: RunnerProcess) -> int:
    queue = httpx.get(runner.url + "/v1/capabilities").json()["queue"]
    running: int = queue["running"]
    return running


def test_capabilities_reports_queue_section() -> None:
    """/v1/capabilities carries the seed's queue section (plus `running`, the requests the
    engines execute, and the wait forecast for a new request, per priority and per model)
    and the loaded model."""
    with (
        start_fake("fake_openai", "--latency-ms", "0") as engine,
        start_runner({"echo": engine.url}, env={"MAX_QUEUE_DEPTH": "7"}) as r,
    ):
        doc = httpx.get(r.url + "/v1/capabilities").json()
        idle = {"high": 0, "normal": 0, "low": 0}
        queue = {
            "depth": 0,
            "maxDepth": 7,
            "avgWaitMs": 0,
            "p95WaitMs": 0,
            "running": 0,
            "forecastWaitMs": idle,
            "forecastWaitMsByModel": {"echo": idle},
        }
        assert doc["queue"] == queue
        assert doc["runnerId"] == "test-runner" and doc["health"] == "healthy"
        assert [m["id"] for m in doc["models"]["loaded"]] == ["echo"]


ACME_KEY = "acme-key-0123456789abcdef0123456789abc"


def test_api_keys_decide_the_tenant(tmp_path: Path) -> None:
    """With API keys in the tenants file the key decides the tenant; a disagreeing header is 403."""
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        "tenants:\n"
        "  acme:\n"
        "    rate_limit: 2req/min\n"
        "    api_keys: ['sha256:" + hashlib.sha256(ACME_KEY.encode()).hexdigest() + "']\n"
    )
    with (
        start_fake("fake_openai", "--latency-ms", "0") as engine,
        start_runner({"echo": engine.url}, env={"TENANTS_FILE": str(tenants)}) as r,
    ):
        key = {"Authorization": f"Bearer {ACME_KEY}"}
        assert _post(r, key).status_code == 200
        assert _post(r, {**key, "X-Tenant-ID": "acme"}).headers["ratelimit-remaining"] == "0"
        assert _post(r, {**key, "X-Tenant-ID": "other"}).status_code == 403
        assert _post(r, {"Authorization": "Bearer wrong"}).status_code == 401
        assert _post(r, {}).status_code == 401
        assert _post(r, key).status_code == 429  # the key's tenant is limited, not the header's
        assert engine.received("/v1/chat/completions") == 2


def test_streamed_answer_carries_rate_limit_headers() -> None:
    """A streamed answer carries RateLimit-* like a JSON one."""
    with (
        start_fake("fake_openai", "--latency-ms", "0", "--chunk-delay-ms", "0") as engine,
        start_runner({"echo": engine.url}, env={"DEFAULT_RATE_LIMIT": "50req/min"}) as r,
        httpx.stream(
            "POST", r.url + "/v1/chat/completions", json={**CHAT, "stream": True}
        ) as streamed,
    ):
        assert streamed.status_code == 200
        assert streamed.headers["ratelimit-limit"] == "50"
        assert streamed.headers["ratelimit-remaining"] == "49"
        assert b"[DONE]" in streamed.read()

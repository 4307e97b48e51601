"""The client's decisions over a mock transport: cache, marking, fall-over, waits, loads.

httpx's MockTransport stands in for the runners here (their answers in the runner's own
shapes); tests/client/test_real_runners.py runs the same paths against real runners. Each
test runs through both façades (`facade`: the blocking classes over `httpx.Client`, the
async ones over `httpx.AsyncClient`), which share one flow per operation.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import pytest

from client import (
    AsyncRunner,
    AsyncRunnerPool,
    DeadlineExceeded,
    LoadCancelled,
    LoadFailed,
    LoadProgress,
    NoRunnerAvailable,
    OpToken,
    Reach,
    Runner,
    RunnerPool,
    RunnerRefused,
    parse_token,
)
from tests.client.docs import caps

Handler = Callable[[httpx.Request], httpx.Response]
Pool = RunnerPool | AsyncRunnerPool
OneRunner = Runner | AsyncRunner
T = TypeVar("T")
FACADES = ("blocking", "async")


@pytest.fixture(params=FACADES)
def facade(request: pytest.FixtureRequest) -> str:
    """Which façade a test drives: `blocking` (httpx.Client) or `async` (httpx.AsyncClient)."""
    return str(request.param)


async def done(result: T | Awaitable[T]) -> T:
    """What a façade's method returned: the result, or (async façade) the result awaited."""
    if inspect.isawaitable(result):
        return await result
    return result


class Clock:
    """A clock that only moves when slept on or told to."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


def error(status: int, code: str, retry_after: int | None = None) -> httpx.Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    body = {"error": {"code": code, "message": f"{code} here", "type": "x"}}
    return httpx.Response(status, json=body, headers=headers)


def chat_ok(_: httpx.Request | None = None) -> httpx.Response:
    headers = {"X-Queue-Wait-Ms": "7", "X-Cache-Hit": "false", "Server": "x"}
    return httpx.Response(200, json={"choices": [{"message": {"content": "hi"}}]}, headers=headers)


def runners(routes: dict[str, Handler], calls: list[str]) -> httpx.MockTransport:
    """`routes` maps "host path" to a handler; every request is logged in `calls`."""

    def handle(request: httpx.Request) -> httpx.Response:
        key = f"{request.url.host} {request.url.path}"
        calls.append(key)
        if key not in routes:
            raise httpx.ConnectError("connection refused", request=request)
        return routes[key](request)

    return httpx.MockTransport(handle)


def capabilities(doc: dict[str, Any]) -> Handler:
    return lambda _: httpx.Response(200, json=doc, headers={"Cache-Control": "max-age=5"})


def pool_of(
    facade: str, routes: dict[str, Handler], calls: list[str], clock: Clock, **kw: Any
) -> Pool:
    """A pool of the runners `routes` names (and `extra` ones that never answer)."""
    urls = [
        f"http://{u}" for u in sorted({key.split()[0] for key in routes} | set(kw.pop("extra", ())))
    ]
    transport = runners(routes, calls)
    if facade == "blocking":
        client = httpx.Client(transport=transport)
        return RunnerPool(urls, client=client, clock=clock, sleep=clock.sleep, **kw)
    aclient = httpx.AsyncClient(transport=transport)
    return AsyncRunnerPool(urls, client=aclient, clock=clock, sleep=clock.asleep, **kw)


def runner_of(facade: str, routes: dict[str, Handler], calls: list[str], clock: Clock) -> OneRunner:
    """Runner `http://a` answering `routes`."""
    transport = runners(routes, calls)
    if facade == "blocking":
        client = httpx.Client(transport=transport)
        return Runner("http://a", client=client, clock=clock, sleep=clock.sleep)
    aclient = httpx.AsyncClient(transport=transport)
    return AsyncRunner("http://a", client=aclient, clock=clock, sleep=clock.asleep)


async def test_pool_refresh_honours_the_cache(facade: str) -> None:
    """Capabilities are asked again only once the runner's max-age has passed."""
    calls: list[str] = []
    clock = Clock()
    pool = pool_of(
        facade, {"a /v1/capabilities": capabilities(caps("a", loaded=("m",)))}, calls, clock
    )
    await done(pool.pick("m"))
    await done(pool.pick("m"))
    clock.now += 4.9
    await done(pool.pick("m"))
    assert calls == ["a /v1/capabilities"]
    clock.now += 0.2
    await done(pool.pick("m"))
    assert calls == ["a /v1/capabilities"] * 2
    assert pool.state("http://a").age(clock.now) == 0.0


async def test_pool_marks_starting_stopping_and_silent_runners(facade: str) -> None:
    """503 with health starting/stopping, and no answer at all, are marked and left out;
    a runner that later fails keeps its last good view, ageing."""
    calls: list[str] = []
    clock = Clock()
    routes = {
        "s /v1/capabilities": lambda _: httpx.Response(503, json=caps("s", health="starting")),
        "t /v1/capabilities": lambda _: httpx.Response(503, json=caps("t", health="stopping")),
        "u /v1/capabilities": capabilities(caps("u", loaded=("m",))),
    }
    pool = pool_of(facade, routes, calls, clock, extra=["gone"])
    assert (await done(pool.pick("m"))).url == "http://u"
    reach = {s.url: s.reach for s in pool.states()}
    assert reach == {
        "http://gone": Reach.UNREACHABLE,
        "http://s": Reach.STARTING,
        "http://t": Reach.STOPPING,
        "http://u": Reach.UP,
    }
    del routes["u /v1/capabilities"]
    clock.now += 6
    with pytest.raises(NoRunnerAvailable) as raised:
        await done(pool.pick("m"))
    assert raised.value.excluded["http://u"].startswith("unreachable (ConnectError")
    state = pool.state("http://u")
    assert state.view is not None and state.view.runner_id == "u" and state.age(clock.now) == 6


async def test_chat_falls_over_on_503_and_returns_runner_headers(facade: str) -> None:
    """The chosen runner answers 503 queue_full: the chat goes to the next runner; the
    answer carries that runner's X-* headers and both attempts."""
    calls: list[str] = []
    clock = Clock()
    routes = {
        "a /v1/capabilities": capabilities(caps("a", loaded=("m",), free_mb=1900)),
        "a /v1/chat/completions": lambda _: error(503, "queue_full", retry_after=4),
        "b /v1/capabilities": capabilities(caps("b", loaded=("m",), free_mb=100)),
        "b /v1/chat/completions": chat_ok,
    }
    pool = pool_of(facade, routes, calls, clock, tenant="acme", priority="high")
    answer = await done(pool.chat("m", [{"role": "user", "content": "hi"}], max_tokens=4))
    assert answer.url == "http://b" and answer.json()["choices"][0]["message"]["content"] == "hi"
    assert answer.headers == {"x-queue-wait-ms": "7", "x-cache-hit": "false"}
    assert answer.queue_wait_ms == 7 and answer.cache_hit is False
    assert [(a.url, a.status, a.code) for a in answer.attempts] == [
        ("http://a", 503, "queue_full"),
        ("http://b", 200, None),
    ]
    assert pool.state("http://a").retry_after_s(clock.now) == 4
    assert (await done(pool.pick("m"))).url == "http://b"  # a's Retry-After now counts as its wait


async def test_chat_sends_tenant_priority_and_body(facade: str) -> None:
    """The helpers send X-Tenant-ID, X-Priority and the cache headers with the body."""
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return chat_ok(request)

    routes = {
        "a /v1/capabilities": capabilities(caps("a", loaded=("m",))),
        "a /v1/chat/completions": record,
    }
    pool = pool_of(facade, routes, [], Clock(), tenant="acme")
    await done(
        pool.chat("m", [{"role": "user", "content": "x"}], priority="low", cache_tag="s1", seed=3)
    )
    request = seen[0]
    assert request.headers["x-tenant-id"] == "acme" and request.headers["x-priority"] == "low"
    assert request.headers["x-cache-tag"] == "s1"
    assert json.loads(request.content) == {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "seed": 3,
    }


async def test_chat_waits_for_retry_after_within_the_deadline(facade: str) -> None:
    """Every runner refused: the client waits what the runner asked, then tries again."""
    clock = Clock()
    answers = iter([error(429, "rate_limit_exceeded", retry_after=3), chat_ok()])
    routes = {
        "a /v1/capabilities": capabilities(caps("a", loaded=("m",))),
        "a /v1/chat/completions": lambda _: next(answers),
    }
    pool = pool_of(facade, routes, [], clock, deadline_s=10)
    answer = await done(pool.chat("m", []))
    assert answer.status == 200 and clock.slept == [3.0]
    assert [a.status for a in answer.attempts] == [429, 200]


async def test_chat_gives_up_when_retry_after_passes_the_deadline(facade: str) -> None:
    """A Retry-After beyond the deadline is not waited for: DeadlineExceeded with the
    attempts and the last refusal."""
    clock = Clock()
    routes = {
        "a /v1/capabilities": capabilities(caps("a", loaded=("m",))),
        "a /v1/chat/completions": lambda _: error(503, "queue_full", retry_after=30),
    }
    pool = pool_of(facade, routes, [], clock, deadline_s=10)
    with pytest.raises(DeadlineExceeded) as raised:
        await done(pool.chat("m", []))
    assert clock.slept == []
    assert isinstance(raised.value.last, RunnerRefused) and raised.value.last.retry_after == 30


async def test_chat_falls_over_on_stale_404_and_connection_refused_but_raises_400(
    facade: str,
) -> None:
    """model_not_loaded (a stale view) and a refused connection go to the next runner; a
    400 is the caller's mistake and is raised at once."""
    calls: list[str] = []
    routes = {
        "a /v1/capabilities": capabilities(caps("a", loaded=("m",), free_mb=1900)),
        "a /v1/chat/completions": lambda _: error(404, "model_not_loaded"),
        "b /v1/capabilities": capabilities(caps("b", loaded=("m",), free_mb=1000)),
        "c /v1/capabilities": capabilities(caps("c", loaded=("m",), free_mb=10)),
        "c /v1/chat/completions": chat_ok,
    }
    pool = pool_of(facade, routes, calls, Clock())
    assert (await done(pool.chat("m", []))).url == "http://c"
    assert pool.state("http://b").reach is Reach.UNREACHABLE
    routes["c /v1/chat/completions"] = lambda _: error(400, "invalid_request")
    with pytest.raises(RunnerRefused) as raised:
        await done(pool.chat("m", []))
    assert raised.value.status == 400 and raised.value.url == "http://c/v1/chat/completions"


def load_routes(statuses: list[dict[str, Any]]) -> dict[str, Handler]:
    polls = iter(statuses)
    accepted = {"taskId": "load-1", "status": "loading", "progress": 0.0, "eta": 9}
    return {
        "a /v1/models/load": lambda _: httpx.Response(202, json=accepted),
        "a /v1/models/load/load-1": lambda _: httpx.Response(200, json=next(polls)),
    }


def task(status: str, progress: float, eta: float | None, **extra: Any) -> dict[str, Any]:
    return {
        "taskId": "load-1",
        "modelId": "m",
        "status": status,
        "progress": progress,
        "eta": eta,
        **extra,
    }


TOKEN = parse_token(
    {
        "opToken": {
            "operation": "model-load",
            "modelId": "m",
            "params": {"maxContextLength": 512},
            "issuedAt": 1,
            "nonce": "n" * 22,
        },
        "signature": "0" * 64,
    }
)


async def test_load_reports_progress_and_returns_the_result(facade: str) -> None:
    """The load posts the body the token approves, reports every poll, and returns the
    completed task's figures."""
    clock = Clock()
    seen: list[LoadProgress] = []
    routes = load_routes(
        [
            task("queued", 0.0, 9),
            task("loading", 0.5, 4),
            task("completed", 1.0, 0, gpuMemoryUsedMB=300, loadTimeMs=2500),
        ]
    )
    posted: list[Any] = []
    post = routes["a /v1/models/load"]
    routes["a /v1/models/load"] = lambda r: posted.append(json.loads(r.content)) or post(r)
    runner = runner_of(facade, routes, [], clock)
    result = await done(runner.load(TOKEN, model="m", progress=seen.append, interval_s=0.5))
    assert posted == [{"modelId": "m", "maxContextLength": 512, "verifiedOpToken": TOKEN.raw}]
    assert [(p.status, p.progress, p.eta) for p in seen] == [
        ("accepted", 0.0, 9.0),
        ("queued", 0.0, 9.0),
        ("loading", 0.5, 4.0),
        ("completed", 1.0, 0.0),
    ]
    assert (result.task_id, result.gpu_memory_used_mb, result.load_time_ms) == ("load-1", 300, 2500)
    assert clock.slept == [0.5, 0.5, 0.5]


@pytest.mark.parametrize(
    ("final", "raised"),
    [
        (task("failed", 0.3, None, error="engine exited with code 1"), LoadFailed),
        (task("cancelled", 0.3, None, error="cancelled"), LoadCancelled),
    ],
)
async def test_load_raises_the_task_outcome(
    facade: str, final: dict[str, Any], raised: type[Exception]
) -> None:
    """A failed task raises LoadFailed with its error; a cancelled one LoadCancelled."""
    clock = Clock()
    routes = load_routes([task("loading", 0.1, 5), final])
    runner = runner_of(facade, routes, [], clock)
    with pytest.raises(raised) as caught:
        await done(runner.load(TOKEN))
    assert isinstance(caught.value, LoadFailed)
    assert caught.value.task_id == "load-1" and caught.value.error == final["error"]


async def test_load_refuses_a_token_for_another_model(facade: str) -> None:
    """A token for another model or operation is refused before anything is sent."""
    calls: list[str] = []
    runner = runner_of(facade, {}, calls, Clock())
    with pytest.raises(ValueError, match="not 'other'"):
        await done(runner.load(TOKEN, model="other"))
    assert calls == []


def token(operation: str, aud: str | None = None, **params: Any) -> OpToken:
    claims = {"operation": operation, "modelId": "m", "params": params, "nonce": "n" * 22}
    return parse_token({"opToken": {**claims, **({"aud": aud} if aud else {})}, "signature": "0"})


async def test_runner_operations_send_what_the_contract_says(facade: str) -> None:
    """Each of one runner's operations sends its request and returns the answer typed:
    capabilities, a plain GET, a task, its cancel, unload, flush and an engine's logs."""
    seen: list[tuple[str, str, Any]] = []

    def answer(status: int, doc: dict[str, Any]) -> Handler:
        def handle(request: httpx.Request) -> httpx.Response:
            body = json.loads(request.content) if request.content else None
            seen.append((request.method, request.url.path, body))
            return httpx.Response(status, json=doc)

        return handle

    cancel = token("task-cancel", taskId="load-1")
    routes = {
        "a /v1/capabilities": answer(200, caps("a", loaded=("m",))),
        "a /health": answer(200, {"status": "healthy"}),
        "a /v1/models/load/load-1": answer(200, task("cancelled", 0.2, None)),
        "a /v1/models/unload": answer(200, {"modelId": "m", "gpuMemoryFreedMB": 300}),
        "a /v1/cache/flush": answer(200, {"entriesRemoved": 2}),
        "a /v1/models/m/logs": answer(200, {"lines": ["one", "two"]}),
    }
    runner = runner_of(facade, routes, [], Clock())
    assert (await done(runner.capabilities())).runner_id == "a"
    assert (await done(runner.get("/health"))).json() == {"status": "healthy"}
    assert (await done(runner.task("load-1"))).status == "cancelled"
    assert (await done(runner.cancel_load("load-1", cancel))).status == "cancelled"
    unloaded = await done(runner.unload(token("model-unload")))
    assert unloaded == {"modelId": "m", "gpuMemoryFreedMB": 300}
    assert await done(runner.flush(token("cache-flush", scope="all"))) == {"entriesRemoved": 2}
    assert await done(runner.logs("m")) == ["one", "two"]
    assert [(method, path) for method, path, _ in seen] == [
        ("GET", "/v1/capabilities"),
        ("GET", "/health"),
        ("GET", "/v1/models/load/load-1"),
        ("DELETE", "/v1/models/load/load-1"),
        ("POST", "/v1/models/unload"),
        ("POST", "/v1/cache/flush"),
        ("GET", "/v1/models/m/logs"),
    ]
    assert seen[3][2] == {"verifiedOpToken": cancel.raw}
    assert seen[5][2]["scope"] == "all"


async def test_pool_inference_helpers_and_load_go_where_they_should(facade: str) -> None:
    """completions, embeddings and transcriptions post their bodies to the picked runner;
    a pool's load goes to the runner its token is addressed to (its `aud`)."""
    seen: list[tuple[str, bytes]] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append((f"{request.url.host} {request.url.path}", request.content))
        return chat_ok(request)

    accepted = {"taskId": "load-1", "status": "loading", "progress": 0.0, "eta": 1}
    routes = {
        "a /v1/capabilities": capabilities(caps("a", loaded=("m",), free_mb=1900)),
        "a /v1/completions": record,
        "a /v1/embeddings": record,
        "a /v1/audio/transcriptions": record,
        "b /v1/capabilities": capabilities(caps("b", loaded=("m",), free_mb=100)),
        "b /v1/models/load": lambda _: httpx.Response(202, json=accepted),
        "b /v1/models/load/load-1": lambda _: httpx.Response(
            200, json=task("completed", 1.0, 0, loadTimeMs=10)
        ),
    }
    pool = pool_of(facade, routes, [], Clock())
    await done(pool.completions("m", "once upon", max_tokens=2))
    await done(pool.embeddings("m", ["a", "b"]))
    await done(pool.transcriptions("m", b"RIFF", language="en"))
    assert [where for where, _ in seen] == [
        "a /v1/completions",
        "a /v1/embeddings",
        "a /v1/audio/transcriptions",
    ]
    assert json.loads(seen[0][1]) == {"model": "m", "prompt": "once upon", "max_tokens": 2}
    assert json.loads(seen[1][1]) == {"model": "m", "input": ["a", "b"]}
    assert b'name="language"' in seen[2][1] and b"RIFF" in seen[2][1]
    loaded = await done(pool.load(token("model-load", aud="b"), interval_s=0))
    assert (loaded.url, loaded.load_time_ms) == ("http://b", 10)
    assert [s.reach for s in await done(pool.refresh(force=True))] == [Reach.UP, Reach.UP]


async def test_async_pool_polls_concurrently_and_falls_over() -> None:
    """The async pool makes the same choices: 503 on the first runner, answer from the next."""
    calls: list[str] = []
    routes = {
        "a /v1/capabilities": capabilities(caps("a", loaded=("m",), free_mb=1900)),
        "a /v1/embeddings": lambda _: error(503, "queue_full", retry_after=2),
        "b /v1/capabilities": capabilities(caps("b", loaded=("m",), free_mb=100)),
        "b /v1/embeddings": lambda _: httpx.Response(200, json={"data": []}),
    }
    client = httpx.AsyncClient(transport=runners(routes, calls))
    async with AsyncRunnerPool(["http://a", "http://b"], client=client) as pool:
        answer = await pool.embeddings("m", "text")
        assert answer.url == "http://b"
        assert {c for c in calls if c.endswith("capabilities")} == {
            "a /v1/capabilities",
            "b /v1/capabilities",
        }
    await client.aclose()


@pytest.mark.timeout(10)
async def test_async_load_stops_following_when_cancelled() -> None:
    """Cancelling the awaiting task stops the polling at once: no poll after the one it
    was awaiting, and no task left behind that could poll (the load goes on at the runner:
    stopping it is a governed cancel of its own)."""
    calls: list[str] = []
    third_poll_sent = asyncio.Event()
    never = asyncio.Event()
    accepted = {"taskId": "load-1", "status": "loading", "progress": 0.0, "eta": 9}

    async def handle(request: httpx.Request) -> httpx.Response:
        key = f"{request.url.host} {request.url.path}"
        calls.append(key)
        if key == "a /v1/models/load":
            return httpx.Response(202, json=accepted)
        if calls.count(key) == 3:  # the third poll hangs until its caller is cancelled
            third_poll_sent.set()
            await never.wait()
        return httpx.Response(200, json=task("loading", 0.1, 5))

    client = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    seen: list[LoadProgress] = []
    async with AsyncRunner("http://a", client=client) as runner:
        following = asyncio.ensure_future(runner.load(TOKEN, progress=seen.append, interval_s=0))
        await asyncio.wait_for(third_poll_sent.wait(), 5)
        following.cancel()
        with pytest.raises(asyncio.CancelledError):
            await following
        assert asyncio.all_tasks() == {asyncio.current_task()}  # nothing left to poll later
        assert calls == ["a /v1/models/load"] + ["a /v1/models/load/load-1"] * 3
        assert [s.status for s in seen] == ["accepted", "loading", "loading"]
    await client.aclose()

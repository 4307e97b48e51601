"""The client's public classes: every flow as a blocking method and as an awaitable one.

Each operation is written once, as a function from a core to a `Flow[T]`
(client/runner.py for one runner; client/core.py, client/inference.py and
client/lifecycle.py for a pool). A façade is that core with a driver:

    Runner          RunnerCore + httpx.Client        runner.capabilities() -> Capabilities
    AsyncRunner     RunnerCore + httpx.AsyncClient   await runner.capabilities()
    RunnerPool      PoolCore   + httpx.Client        pool.chat(model, messages) -> Answer
    AsyncRunnerPool PoolCore   + httpx.AsyncClient   await pool.chat(model, messages)

and lists the operations it offers: `chat = Blocking(inference.chat)` is a method that
takes `inference.chat`'s arguments (after the core) and returns what its flow returns,
typed as such (`_run(Flow[T]) -> T`). Only `openai_client` is written per façade: it hands
out the SDK's blocking or async client.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    Self,
    TypeVar,
    Unpack,
    overload,
)

import httpx

from client import core, inference, lifecycle, runner
from client.core import PoolCore, PoolOptions
from client.inference import request_headers
from client.runner import RunnerCore, RunnerOptions
from client.steps import Flow
from client.transport import drive_async, drive_sync

if TYPE_CHECKING:
    import openai

DEFAULT_TIMEOUT_S = 10.0
"""httpx's timeout for a client made here (one given with `client=` keeps its own)."""

C = TypeVar("C")
P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R")


def _result(annotation: object) -> object:
    """`T` of a flow's `Flow[T]` annotation (a string: annotations are postponed)."""
    text = str(annotation)
    return text[len("Flow[") : -1] if text.startswith("Flow[") else inspect.Signature.empty


class _Operation(Generic[C, P, T]):
    """A flow-building function, kept to be made a method of a façade."""

    def __init__(self, build: Callable[Concatenate[C, P], Flow[T]]) -> None:
        self.build = build
        self.__doc__ = build.__doc__
        signature = inspect.signature(build)
        self._signature = signature.replace(
            parameters=list(signature.parameters.values())[1:],
            return_annotation=_result(signature.return_annotation),
        )

    def _dressed(self, method: Callable[P, R]) -> Callable[P, R]:
        """`method` named, documented and signed as the operation (its arguments after the
        core), so help() and editors show the operation's own signature."""
        method.__name__ = method.__qualname__ = self.build.__name__
        method.__doc__ = self.build.__doc__
        method.__signature__ = self._signature  # type: ignore[attr-defined]
        return method


class Blocking(_Operation[C, P, T]):
    """A flow-building function as a method of a blocking façade: calling it builds the
    flow from the façade (its core) and the arguments, and runs it to its result."""

    @overload
    def __get__(self, facade: None, owner: type[object]) -> Self: ...
    @overload
    def __get__(self, facade: C, owner: type[object]) -> Callable[P, T]: ...
    def __get__(self, facade: C | None, owner: type[object]) -> Self | Callable[P, T]:
        if facade is None:
            return self
        driver, build = _driver(facade, SyncDriver), self.build

        def method(*args: P.args, **kwargs: P.kwargs) -> T:
            return driver._run(build(facade, *args, **kwargs))

        return self._dressed(method)


class Awaited(_Operation[C, P, T]):
    """A flow-building function as a method of an async façade: the same, awaited."""

    @overload
    def __get__(self, facade: None, owner: type[object]) -> Self: ...
    @overload
    def __get__(
        self, facade: C, owner: type[object]
    ) -> Callable[P, Coroutine[object, object, T]]: ...
    def __get__(
        self, facade: C | None, owner: type[object]
    ) -> Self | Callable[P, Coroutine[object, object, T]]:
        if facade is None:
            return self
        driver, build = _driver(facade, AsyncDriver), self.build

        async def method(*args: P.args, **kwargs: P.kwargs) -> T:
            return await driver._run(build(facade, *args, **kwargs))

        return self._dressed(method)


class SyncDriver:
    """Runs flows over a blocking `httpx.Client` (yours, or one made and closed here)."""

    def __init__(
        self,
        client: httpx.Client | None,
        timeout_s: float,
        sleep: Callable[[float], object],
    ) -> None:
        self._own = client is None
        self.client = client or httpx.Client(timeout=timeout_s)
        self._sleep = sleep

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._own:
            self.client.close()

    def _run(self, flow: Flow[T]) -> T:
        return drive_sync(flow, self.client, sleep=self._sleep)


class AsyncDriver:
    """Runs flows over an `httpx.AsyncClient` (yours, or one made and closed here)."""

    def __init__(
        self,
        client: httpx.AsyncClient | None,
        timeout_s: float,
        sleep: Callable[[float], Awaitable[object]],
    ) -> None:
        self._own = client is None
        self.client = client or httpx.AsyncClient(timeout=timeout_s)
        self._sleep = sleep

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own:
            await self.client.aclose()

    async def _run(self, flow: Flow[T]) -> T:
        return await drive_async(flow, self.client, sleep=self._sleep)


class Runner(RunnerCore, SyncDriver):
    """One runner over a blocking `httpx.Client` (client/runner.py has each operation)."""

    def __init__(
        self,
        url: str,
        *,
        client: httpx.Client | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        sleep: Callable[[float], object] = time.sleep,
        **options: Unpack[RunnerOptions],
    ) -> None:
        RunnerCore.__init__(self, url, **options)
        SyncDriver.__init__(self, client, timeout_s, sleep)

    get = Blocking(runner.get)
    capabilities = Blocking(runner.capabilities)
    load = Blocking(runner.load)
    task = Blocking(runner.task)
    cancel_load = Blocking(runner.cancel_load)
    unload = Blocking(runner.unload)
    flush = Blocking(runner.flush)
    logs = Blocking(runner.logs)


class AsyncRunner(RunnerCore, AsyncDriver):
    """One runner over an `httpx.AsyncClient`: `Runner`'s methods, awaited."""

    def __init__(
        self,
        url: str,
        *,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        **options: Unpack[RunnerOptions],
    ) -> None:
        RunnerCore.__init__(self, url, **options)
        AsyncDriver.__init__(self, client, timeout_s, sleep)

    get = Awaited(runner.get)
    capabilities = Awaited(runner.capabilities)
    load = Awaited(runner.load)
    task = Awaited(runner.task)
    cancel_load = Awaited(runner.cancel_load)
    unload = Awaited(runner.unload)
    flush = Awaited(runner.flush)
    logs = Awaited(runner.logs)


class RunnerPool(PoolCore, SyncDriver):
    """Several runners as one, blocking (docs/client.md): capabilities polled lazily
    within each runner's cache, one runner picked per request, fall-over on refusal.

        with RunnerPool(["http://gpu-a:8080", "http://gpu-b:8080"], tenant="acme") as pool:
            choice = pool.pick("gemma-3-270m")          # choice.url, choice.reason
            answer = pool.chat("gemma-3-270m", [{"role": "user", "content": "Hi"}])
            answer.json()["choices"][0], answer.headers["x-queue-wait-ms"], answer.url

    `refresh(force=True)` polls now regardless of age; `states()` reads what is known
    (with `age(now)`). A pool's states are not locked: share one pool per thread, or use
    `AsyncRunnerPool` from one event loop.
    """

    def __init__(
        self,
        urls: Iterable[str],
        *,
        client: httpx.Client | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        sleep: Callable[[float], object] = time.sleep,
        **options: Unpack[PoolOptions],
    ) -> None:
        PoolCore.__init__(self, urls, **options)
        SyncDriver.__init__(self, client, timeout_s, sleep)

    refresh = Blocking(core.refresh)
    pick = Blocking(core.pick)
    load = Blocking(lifecycle.pool_load)
    chat = Blocking(inference.chat)
    completions = Blocking(inference.completions)
    embeddings = Blocking(inference.embeddings)
    transcriptions = Blocking(inference.transcriptions)

    def openai_client(
        self, model: str, *, priority: str | None = None, **kwargs: object
    ) -> openai.OpenAI:
        """An `openai.OpenAI` client pointed at the runner `pick(model)` chooses now, sending
        this pool's tenant and priority headers (needs the `openai` package)."""
        import openai

        choice = self.pick(model, priority)
        return openai.OpenAI(**_openai_options(self, choice.url, priority, kwargs))


class AsyncRunnerPool(PoolCore, AsyncDriver):
    """`RunnerPool` over an `httpx.AsyncClient`: the same methods, awaited; the runners'
    capabilities are polled concurrently."""

    def __init__(
        self,
        urls: Iterable[str],
        *,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        **options: Unpack[PoolOptions],
    ) -> None:
        PoolCore.__init__(self, urls, **options)
        AsyncDriver.__init__(self, client, timeout_s, sleep)

    refresh = Awaited(core.refresh)
    pick = Awaited(core.pick)
    load = Awaited(lifecycle.pool_load)
    chat = Awaited(inference.chat)
    completions = Awaited(inference.completions)
    embeddings = Awaited(inference.embeddings)
    transcriptions = Awaited(inference.transcriptions)

    async def openai_client(
        self, model: str, *, priority: str | None = None, **kwargs: object
    ) -> openai.AsyncOpenAI:
        """An `openai.AsyncOpenAI` client pointed at the runner `pick(model)` chooses now."""
        import openai

        choice = await self.pick(model, priority)
        return openai.AsyncOpenAI(**_openai_options(self, choice.url, priority, kwargs))


def _openai_options(
    pool: PoolCore, url: str, priority: str | None, extra: dict[str, object]
) -> dict[str, Any]:
    """The SDK client's options: the runner's `/v1`, the pool's key and headers, `extra`."""
    headers = request_headers(pool.tenant, priority or pool.priority)
    options = {"base_url": url + "/v1", "api_key": pool.api_key or "unused"}  # one is required
    return {**options, "default_headers": headers, **extra}


def _driver(facade: object, kind: type[T]) -> T:
    if not isinstance(facade, kind):
        raise TypeError(f"{type(facade).__name__} runs no flows of this kind ({kind.__name__})")
    return facade

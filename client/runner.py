"""One runner, addressed by URL: its documents and its governed operations.

`Runner` (httpx.Client) and `AsyncRunner` (httpx.AsyncClient) have the same methods; each
builds a flow (client/lifecycle.py, client/steps.py) and runs it with its driver. The
CLI (`quorum status|load|unload|flush|tasks|logs`) is built on `Runner`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from client.capabilities import Capabilities, parse_capabilities
from client.core import normalize
from client.errors import RunnerRefused
from client.lifecycle import (
    LoadProgress,
    LoadResult,
    ProgressCallback,
    cancel_flow,
    governed_flow,
    load_flow,
    task_flow,
)
from client.steps import Call, Flow, Reply, call, expect, refusal
from client.tokens import OpToken
from client.transport import drive_async, drive_sync

DEFAULT_TIMEOUT_S = 10.0


def identity_headers(tenant: str | None, api_key: str | None) -> dict[str, str]:
    """How the runner knows who asks: X-Tenant-ID, and the tenant's API key if keys are on."""
    headers = {}
    if tenant:
        headers["X-Tenant-ID"] = tenant
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


class _Flows:
    """The flows of one runner's operations (no I/O)."""

    def __init__(
        self,
        url: str,
        tenant: str | None,
        api_key: str | None,
        clock: Callable[[], float],
        epoch: Callable[[], float],
    ) -> None:
        self.url = normalize(url)
        self.headers = identity_headers(tenant, api_key)
        self.clock = clock
        self.epoch = epoch

    def _get(self, path: str) -> Flow[Reply]:
        return call(Call("GET", self.url + path, headers=self.headers))

    def _capabilities(self) -> Flow[Capabilities]:
        reply = yield from self._get("/v1/capabilities")
        if reply.status not in (200, 503) or not isinstance(reply.json(), dict):
            raise refusal(reply, self.epoch())
        return parse_capabilities(reply.json())

    def _load(
        self,
        token: OpToken,
        model: str | None,
        progress: ProgressCallback | None,
        interval_s: float,
        timeout_s: float | None,
    ) -> Flow[LoadResult]:
        return load_flow(
            self.url,
            token,
            model=model,
            progress=progress,
            interval_s=interval_s,
            timeout_s=timeout_s,
            clock=self.clock,
            epoch=self.epoch,
        )

    def _logs(self, model: str) -> Flow[list[str]]:
        path = f"/v1/models/{quote(model, safe='/')}/logs"
        call = Call("GET", self.url + path, headers=self.headers)
        reply = yield from expect(call, 200, self.epoch())
        doc = reply.json()
        lines = doc.get("lines") if isinstance(doc, dict) else None
        if not isinstance(lines, list):
            raise RunnerRefused(self.url, reply.status, "bad_answer", "no lines in the answer")
        return [str(line) for line in lines]


class Runner(_Flows):
    """One runner over a blocking `httpx.Client` (yours, or one made and closed here)."""

    def __init__(
        self,
        url: str,
        *,
        tenant: str | None = None,
        api_key: str | None = None,
        client: httpx.Client | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        epoch: Callable[[], float] = time.time,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        super().__init__(url, tenant, api_key, clock, epoch)
        self._own = client is None
        self.client = client or httpx.Client(timeout=timeout_s)
        self._sleep = sleep

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._own:
            self.client.close()

    def _run(self, flow: Flow[Any]) -> Any:
        return drive_sync(flow, self.client, sleep=self._sleep)

    def get(self, path: str) -> Reply:
        """Any GET, as it came back (health, metrics, ...); RunnerUnreachable if no answer."""
        reply: Reply = self._run(self._get(path))
        return reply

    def capabilities(self) -> Capabilities:
        view: Capabilities = self._run(self._capabilities())
        return view

    def load(
        self,
        token: OpToken,
        *,
        model: str | None = None,
        progress: ProgressCallback | None = None,
        interval_s: float = 1.0,
        timeout_s: float | None = None,
    ) -> LoadResult:
        """Load the model the token approves and follow the task (client/lifecycle.py)."""
        result: LoadResult = self._run(self._load(token, model, progress, interval_s, timeout_s))
        return result

    def task(self, task_id: str) -> LoadProgress:
        found: LoadProgress = self._run(task_flow(self.url, task_id, self.epoch))
        return found

    def cancel_load(self, task_id: str, token: OpToken) -> LoadProgress:
        done: LoadProgress = self._run(cancel_flow(self.url, task_id, token, self.epoch))
        return done

    def unload(self, token: OpToken) -> Mapping[str, Any]:
        return dict(self._run(governed_flow(self.url, "/v1/models/unload", token, "model-unload")))

    def flush(self, token: OpToken) -> Mapping[str, Any]:
        return dict(self._run(governed_flow(self.url, "/v1/cache/flush", token, "cache-flush")))

    def logs(self, model: str) -> list[str]:
        """An engine's log lines (ADMIN_TENANTS only: 403 RunnerRefused otherwise)."""
        lines: list[str] = self._run(self._logs(model))
        return lines


class AsyncRunner(_Flows):
    """One runner over an `httpx.AsyncClient`; the same methods as `Runner`, awaited."""

    def __init__(
        self,
        url: str,
        *,
        tenant: str | None = None,
        api_key: str | None = None,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        epoch: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(url, tenant, api_key, clock, epoch)
        self._own = client is None
        self.client = client or httpx.AsyncClient(timeout=timeout_s)

    async def __aenter__(self) -> AsyncRunner:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own:
            await self.client.aclose()

    async def _run(self, flow: Flow[Any]) -> Any:
        return await drive_async(flow, self.client)

    async def get(self, path: str) -> Reply:
        reply: Reply = await self._run(self._get(path))
        return reply

    async def capabilities(self) -> Capabilities:
        view: Capabilities = await self._run(self._capabilities())
        return view

    async def load(
        self,
        token: OpToken,
        *,
        model: str | None = None,
        progress: ProgressCallback | None = None,
        interval_s: float = 1.0,
        timeout_s: float | None = None,
    ) -> LoadResult:
        flow = self._load(token, model, progress, interval_s, timeout_s)
        result: LoadResult = await self._run(flow)
        return result

    async def task(self, task_id: str) -> LoadProgress:
        found: LoadProgress = await self._run(task_flow(self.url, task_id, self.epoch))
        return found

    async def cancel_load(self, task_id: str, token: OpToken) -> LoadProgress:
        done: LoadProgress = await self._run(cancel_flow(self.url, task_id, token, self.epoch))
        return done

    async def unload(self, token: OpToken) -> Mapping[str, Any]:
        flow = governed_flow(self.url, "/v1/models/unload", token, "model-unload")
        return dict(await self._run(flow))

    async def flush(self, token: OpToken) -> Mapping[str, Any]:
        flow = governed_flow(self.url, "/v1/cache/flush", token, "cache-flush")
        return dict(await self._run(flow))

    async def logs(self, model: str) -> list[str]:
        lines: list[str] = await self._run(self._logs(model))
        return lines

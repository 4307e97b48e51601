"""One runner, addressed by URL: its documents and governed operations, as flows.

`RunnerCore` is the address and who asks; each function below builds one operation's
flow from it (client/steps.py). `Runner` and `AsyncRunner` (client/facades.py) run them
with a blocking or an async httpx client. The CLI (`quorum status|load|unload|flush|
cancel|tasks|logs`) is built on `Runner`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypedDict
from urllib.parse import quote

from client.capabilities import Capabilities, parse_capabilities
from client.core import identity_headers, normalize
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


class RunnerOptions(TypedDict, total=False):
    """`RunnerCore`'s keyword arguments, for the façades that pass them on."""

    tenant: str | None
    api_key: str | None
    clock: Callable[[], float]
    epoch: Callable[[], float]


class RunnerCore:
    """One runner's base URL, who asks (`tenant`, `api_key`) and the clocks (no I/O)."""

    def __init__(
        self,
        url: str,
        *,
        tenant: str | None = None,
        api_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        epoch: Callable[[], float] = time.time,
    ) -> None:
        self.url = normalize(url)
        self.headers = identity_headers(tenant, api_key)
        self.clock = clock
        self.epoch = epoch


def get(runner: RunnerCore, path: str) -> Flow[Reply]:
    """Any GET, as it came back (health, metrics, ...); RunnerUnreachable if no answer."""
    return call(Call("GET", runner.url + path, headers=runner.headers))


def capabilities(runner: RunnerCore) -> Flow[Capabilities]:
    """GET /v1/capabilities (200, or 503 while starting or stopping), typed."""
    reply = yield from get(runner, "/v1/capabilities")
    if reply.status not in (200, 503) or not isinstance(reply.json(), dict):
        raise refusal(reply, runner.epoch())
    return parse_capabilities(reply.json())


def load(
    runner: RunnerCore,
    token: OpToken,
    *,
    model: str | None = None,
    progress: ProgressCallback | None = None,
    interval_s: float = 1.0,
    timeout_s: float | None = None,
) -> Flow[LoadResult]:
    """Load the model the token approves and follow the task (`lifecycle.load_flow`)."""
    return load_flow(
        runner.url,
        token,
        model=model,
        progress=progress,
        interval_s=interval_s,
        timeout_s=timeout_s,
        clock=runner.clock,
        epoch=runner.epoch,
    )


def task(runner: RunnerCore, task_id: str) -> Flow[LoadProgress]:
    """One look at a load task (404 -> RunnerRefused)."""
    return task_flow(runner.url, task_id, runner.epoch)


def cancel_load(runner: RunnerCore, task_id: str, token: OpToken) -> Flow[LoadProgress]:
    """Cancel a load task with a `task-cancel` token signed for its id."""
    return cancel_flow(runner.url, task_id, token, runner.epoch)


def unload(runner: RunnerCore, token: OpToken) -> Flow[dict[str, object]]:
    """POST /v1/models/unload with the body its `model-unload` token approves."""
    return governed_flow(runner.url, "/v1/models/unload", token, "model-unload", runner.epoch)


def flush(runner: RunnerCore, token: OpToken) -> Flow[dict[str, object]]:
    """POST /v1/cache/flush with the body its `cache-flush` token approves."""
    return governed_flow(runner.url, "/v1/cache/flush", token, "cache-flush", runner.epoch)


def logs(runner: RunnerCore, model: str) -> Flow[list[str]]:
    """An engine's log lines (ADMIN_TENANTS only: 403 RunnerRefused otherwise)."""
    path = f"/v1/models/{quote(model, safe='/')}/logs"
    reply = yield from expect(
        Call("GET", runner.url + path, headers=runner.headers), 200, runner.epoch()
    )
    doc = reply.json()
    lines = doc.get("lines") if isinstance(doc, dict) else None
    if not isinstance(lines, list):
        raise RunnerRefused(runner.url, reply.status, "bad_answer", "no lines in the answer")
    return [str(line) for line in lines]

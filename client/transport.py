"""The two drivers that run a flow (`client/steps.py`): one over `httpx.Client`, one over
`httpx.AsyncClient`. This is the one place httpx's exceptions are translated: a
transport failure becomes `NoReply` (sent or not), which the flow decides about.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx

from client.steps import Call, Flow, NoReply, Outcome, Refresh, Reply, Sleep, Step

T = TypeVar("T")
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""Failures before the request left: safe to send it elsewhere."""


def drive_sync(
    flow: Flow[T],
    client: httpx.Client,
    *,
    refresh: Callable[[], object] = lambda: None,
    sleep: Callable[[float], object] = time.sleep,
) -> T:
    """Run `flow` to its result, performing its steps one by one."""
    outcome: Outcome = None
    while True:
        try:
            step: Step = flow.send(outcome)
        except StopIteration as done:
            result: T = done.value
            return result
        if isinstance(step, Call):
            try:
                outcome = _reply(step, client.request(step.method, step.url, **_kwargs(step)))
            except httpx.TransportError as exc:
                outcome = _no_reply(step, exc)
        elif isinstance(step, Sleep):
            sleep(step.seconds)
            outcome = None
        else:
            assert isinstance(step, Refresh)
            refresh()
            outcome = None


async def drive_async(
    flow: Flow[T],
    client: httpx.AsyncClient,
    *,
    refresh: Callable[[], Awaitable[object]] | None = None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> T:
    """Run `flow` to its result; cancelling the caller stops it between steps."""
    outcome: Outcome = None
    while True:
        try:
            step: Step = flow.send(outcome)
        except StopIteration as done:
            result: T = done.value
            return result
        if isinstance(step, Call):
            try:
                response = await client.request(step.method, step.url, **_kwargs(step))
                outcome = _reply(step, response)
            except httpx.TransportError as exc:
                outcome = _no_reply(step, exc)
        elif isinstance(step, Sleep):
            await sleep(step.seconds)
            outcome = None
        else:
            assert isinstance(step, Refresh)
            if refresh is not None:
                await refresh()
            outcome = None


def _kwargs(step: Call) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"headers": dict(step.headers)}
    if step.files is not None:
        kwargs["files"] = dict(step.files)
        kwargs["data"] = dict(step.data or {})
    elif step.json is not None:
        kwargs["json"] = step.json
    if step.timeout_s is not None:
        kwargs["timeout"] = step.timeout_s
    return kwargs


def _reply(step: Call, response: httpx.Response) -> Reply:
    headers = {name.lower(): value for name, value in response.headers.items()}
    return Reply(step.url, response.status_code, headers, response.content)


def _no_reply(step: Call, exc: httpx.TransportError) -> NoReply:
    reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return NoReply(step.url, reason, sent=not isinstance(exc, NOT_SENT))

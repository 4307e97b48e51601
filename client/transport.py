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

from client.steps import Call, Calls, Flow, NoReply, Outcome, Reply, Step

T = TypeVar("T")
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""Failures before the request left: safe to send it elsewhere."""


def drive_sync(
    flow: Flow[T], client: httpx.Client, *, sleep: Callable[[float], object] = time.sleep
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
            outcome = _send_sync(client, step)
        elif isinstance(step, Calls):
            outcome = tuple(_send_sync(client, call) for call in step.calls)
        else:
            sleep(step.seconds)
            outcome = None


async def drive_async(
    flow: Flow[T],
    client: httpx.AsyncClient,
    *,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> T:
    """Run `flow` to its result; `Calls` concurrently. Cancelling the caller stops it
    between steps (and cancels the calls in progress)."""
    outcome: Outcome = None
    while True:
        try:
            step: Step = flow.send(outcome)
        except StopIteration as done:
            result: T = done.value
            return result
        if isinstance(step, Call):
            outcome = await _send_async(client, step)
        elif isinstance(step, Calls):
            outcome = tuple(await asyncio.gather(*(_send_async(client, c) for c in step.calls)))
        else:
            await sleep(step.seconds)
            outcome = None


def _send_sync(client: httpx.Client, step: Call) -> Reply | NoReply:
    try:
        return _reply(step, client.request(step.method, step.url, **_kwargs(step)))
    except httpx.TransportError as exc:
        return _no_reply(step, exc)


async def _send_async(client: httpx.AsyncClient, step: Call) -> Reply | NoReply:
    try:
        return _reply(step, await client.request(step.method, step.url, **_kwargs(step)))
    except httpx.TransportError as exc:
        return _no_reply(step, exc)


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

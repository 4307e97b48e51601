"""The one poll-until helper of the suite: wait, bounded, on observable state.

A test that waits for something another process or task does polls its observable state
(an HTTP answer, /proc, a store) with `eventually` (from plain code) or `eventually_async`
(from a coroutine, where the loop must keep running): never a bare sleep, never unbounded.
The bound is generous (a slow, busy two-core machine); a passing test never waits it out.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

T = TypeVar("T")

TIMEOUT_S = 30.0
"""How long a check may take to hold before the test fails."""


def eventually(
    check: Callable[[], T], timeout: float = TIMEOUT_S, what: str = "condition", every: float = 0.02
) -> T:
    """Call `check()` every `every` s until it returns something truthy; that value.
    AssertionError naming `what` once `timeout` s have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(every)


async def eventually_async(
    check: Callable[[], T] | Callable[[], Awaitable[T]],
    timeout: float = TIMEOUT_S,
    what: str = "condition",
    every: float = 0.01,
) -> T:
    """`eventually` from a coroutine: `check` may be a plain or an async function (a
    check that hangs counts against `timeout` too); the event loop runs between checks."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                value = check()
                if inspect.isawaitable(value):
                    value = await value
                if value:
                    return cast(T, value)
                await asyncio.sleep(every)
    except TimeoutError:
        raise AssertionError(f"{what} not reached within {timeout} s") from None

"""A request's deadline after its grant (`X-Request-Deadline-Ms`, docs/api.md "Deadlines").

The scheduler holds a request to its deadline while it waits (504 `deadline_exceeded`);
what is left of it once granted bounds the rest until the answer's first byte: the
engine's placement (a llama-server slot's erase, save or restore) and its work, up to the
whole answer of a request that is not streamed, or a stream's first chunk. When it passes
the engine's connection is dropped (the engine then aborts, as for a client gone) and the
client gets 504 `deadline_exceeded`, so a client that says how long it waits is answered
within that time, whatever the engine's speed and `ENGINE_READ_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from runner.errors import DeadlineAtEngine


def left_s(deadline_ms: int | None, queue_wait_ms: int) -> float | None:
    """Seconds left of a granted request's deadline (None: it has none); never below 0."""
    if deadline_ms is None:
        return None
    return max(0.0, (deadline_ms - queue_wait_ms) / 1000)


@asynccontextmanager
async def first_byte_within(
    deadline_ms: int | None, queue_wait_ms: int
) -> AsyncIterator[asyncio.Timeout | None]:
    """Bound the block by what is left of the deadline: 504 `DeadlineAtEngine` when it
    passes inside. The block calls `reschedule(None)` on what it gets once the answer's
    first byte left (a stream's headers); None: no deadline, nothing bounded."""
    left = left_s(deadline_ms, queue_wait_ms)
    if left is None:
        yield None
        return
    cut = asyncio.timeout(left)
    try:
        async with cut:
            yield cut
    except TimeoutError:
        if not cut.expired():
            raise
        raise DeadlineAtEngine(queueWaitMs=queue_wait_ms, deadlineMs=deadline_ms) from None

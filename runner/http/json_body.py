"""Request bodies parsed as JSON without stalling the event loop.

orjson parses about a gigabyte a second here, so a body of a few KiB (the data path's)
costs microseconds and is parsed where it is, with no await; a body above OFFLOAD_BYTES
(up to MAX_BODY_BYTES, 8 MiB: milliseconds of CPU) is parsed in a worker thread, so one
tenant sending big bodies does not hold every other request of the runner meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

OFFLOAD_BYTES = 256 * 1024
"""Bodies of at least this size are parsed (and written back) off the event loop."""

Offload = Callable[[Callable[[bytes], Any], bytes], Awaitable[Any]]


async def _to_thread(parse: Callable[[bytes], Any], body: bytes) -> Any:
    return await asyncio.to_thread(parse, body)


async def load_json(body: bytes, offload: Offload = _to_thread) -> Any:
    """`orjson.loads(body)`, in a worker thread when the body is large (raises
    orjson.JSONDecodeError as `orjson.loads` does)."""
    if len(body) < OFFLOAD_BYTES:
        return orjson.loads(body)
    return await offload(orjson.loads, body)


async def dump_json(obj: Any, size_hint: int) -> bytes:
    """`orjson.dumps(obj)`, in a worker thread when the body it came from was large."""
    if size_hint < OFFLOAD_BYTES:
        return orjson.dumps(obj)
    return await asyncio.to_thread(orjson.dumps, obj)

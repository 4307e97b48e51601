"""The HTTP client the data path uses to reach engines, and the one place that
translates its exceptions into the runner's (see runner/errors.py).

aiohttp, not httpx: measured here, httpx.AsyncClient fell to 0.05-0.12 of
direct throughput at 64 concurrent requests; aiohttp keeps up.
"""

from __future__ import annotations

import asyncio

import aiohttp

from runner.errors import (
    EngineBadResponse,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
)


def make_session(connect_timeout_s: float, read_timeout_s: float) -> aiohttp.ClientSession:
    """One pooled session for all engines: keep-alive, no per-host cap, no decompression."""
    connector = aiohttp.TCPConnector(
        limit=0,
        limit_per_host=0,
        keepalive_timeout=30,
        enable_cleanup_closed=False,
        ttl_dns_cache=None,
    )
    timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=read_timeout_s)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
        raise_for_status=False,
    )


def translate(exc: BaseException, model: str) -> EngineError:
    """Map a client-side failure talking to `model`'s engine to a runner error."""
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return EngineTimeout(f"engine for model {model!r} did not answer in time")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return EngineUnavailable(f"engine for model {model!r} is unreachable")
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return EngineUnavailable(f"engine for model {model!r} closed the connection")
    if isinstance(exc, aiohttp.ClientResponseError):
        return EngineBadResponse(f"engine for model {model!r} sent an invalid HTTP response")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return EngineUnavailable(f"engine for model {model!r} failed: {type(exc).__name__}")
    raise exc

"""Is an engine there? One cheap question per engine, and the tally of missed answers.

The engine watch (`runner/engines/watch.py`) asks it of every engine whose kind names a
probe (`adapters.kind.Traits.probe_path`), attached by URL (a lost one fails its model)
or started by the runner (a hung one is killed: a crash). The rule is the same for
both: any HTTP answer within the timeout, whatever its status, means the engine is there
(a busy engine still answers it: llama-server and vLLM answer `/health` from their HTTP
threads, ComfyUI `/system_stats` from its event loop while a prompt runs); `misses`
probes missed in a row mean it is not (`MissedProbes`, pure).

    ENGINE_PROBE_MISSES     3    probes missed in a row before the engine is given up
    ENGINE_PROBE_TIMEOUT_S  5    how long one probe waits for an answer
    ENGINE_STATS_INTERVAL_S 2    how often each engine is probed
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Iterable
from typing import Generic, Protocol, TypeVar

import httpx

from adapters.engine_urls import split_unix


class Prober(Protocol):
    """Asks one engine whether it is there (the side effect behind the watches)."""

    async def answers(self, url: str) -> bool: ...

    async def aclose(self) -> None: ...


class HttpProber:
    """`GET url`; True on any HTTP answer within `timeout_s`. No proxy: the engine client
    never goes through one, so neither does the question whether the engine is there. An
    engine on a Unix socket (`adapters.engine_urls.unix_url`) is asked over it."""

    def __init__(self, timeout_s: float, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.timeout_s = timeout_s
        self.client = httpx.AsyncClient(timeout=timeout_s, transport=transport, trust_env=False)
        self._sockets: dict[str, httpx.AsyncClient] = {}

    async def answers(self, url: str) -> bool:
        sock, url = split_unix(url)
        if sock is not None and not os.path.exists(sock):  # the engine is gone for good
            stale = self._sockets.pop(sock, None)
            if stale is not None:
                await stale.aclose()
            return False
        client = self.client if sock is None else self._socket_client(sock)
        try:
            await client.get(url)
        except httpx.HTTPError:
            return False
        return True

    def _socket_client(self, sock: str) -> httpx.AsyncClient:
        client = self._sockets.get(sock)
        if client is None:
            transport = httpx.AsyncHTTPTransport(uds=sock)
            client = httpx.AsyncClient(timeout=self.timeout_s, transport=transport, trust_env=False)
            self._sockets[sock] = client
        return client

    async def aclose(self) -> None:
        await self.client.aclose()
        for client in self._sockets.values():
            await client.aclose()
        self._sockets.clear()


K = TypeVar("K", bound=Hashable)


class MissedProbes(Generic[K]):
    """Probes missed in a row, per engine (pure: no I/O, no clock).

    1. An answer: the engine's count is back to 0.
    2. No answer: its count grows by one; at `misses` the engine is given up
       (`observe` answers True once) and its count starts again from 0.
    3. An engine no longer watched (`keep_only`) loses its count: watched again later
       (a restart, a reload), it starts from 0.
    """

    def __init__(self, misses: int) -> None:
        if misses < 1:
            raise ValueError("misses must be at least 1")
        self.misses = misses
        self._missed: dict[K, int] = {}

    def observe(self, key: K, answered: bool) -> bool:
        """Record one probe of `key`; True when it has now missed `misses` in a row."""
        if answered:  # 1
            self._missed.pop(key, None)
            return False
        missed = self._missed.get(key, 0) + 1  # 2
        if missed < self.misses:
            self._missed[key] = missed
            return False
        self._missed.pop(key, None)
        return True

    def missed(self, key: K) -> int:
        return self._missed.get(key, 0)

    def keep_only(self, keys: Iterable[K]) -> None:
        """Step 3."""
        keep = set(keys)
        for key in [k for k in self._missed if k not in keep]:
            del self._missed[key]

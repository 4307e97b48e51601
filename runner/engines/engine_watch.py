"""What the engines say about themselves, read off the hot path on a timer.

Every ENGINE_STATS_INTERVAL_S the watch asks each ready engine that reports its load:

- vLLM: `/metrics` (`VllmEngine.scrape`): KV cache usage, requests running and waiting;
  the scrape also hands vLLM's own families to the collector that re-exposes them on the
  runner's `/metrics` ("standard vLLM metrics + additions");
- ComfyUI: `/queue` (prompts running and pending), once per server however many models
  share it;

and learns each engine kind's version once (vLLM: `GET /version`; ComfyUI:
`/system_stats` `system.comfyui_version`; llama-server: the build `scripts/install`
makes). `/v1/capabilities` reads `loads` and `versions`; nothing that answers a request
waits on an engine. An engine that does not answer in time keeps no figures (its model
reads 0) until it answers again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from adapters.base import Engine
from adapters.comfyui.engine import ComfyUIEngine
from adapters.llama_server.engine import LLAMA_SERVER_VERSION
from adapters.vllm.engine import VllmEngine, VllmMetricsCollector
from faults import QuorumError
from runner.runtime.periodic import Periodic

log = logging.getLogger("quorum.engines")


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One engine's own figures at its last poll (what it does not report reads 0)."""

    kv_cache_mb: float = 0.0
    kv_cache_utilization: float = 0.0  # 0..1
    waiting: int = 0  # requests queued inside the engine
    running: int = 0  # requests the engine is executing


class EngineWatch:
    def __init__(
        self,
        engines: Mapping[str, Engine],
        interval_s: float,
        vllm_metrics: VllmMetricsCollector | None = None,
    ) -> None:
        self.engines = engines
        self.interval_s = interval_s
        self.vllm_metrics = vllm_metrics
        self.loads: dict[str, EngineLoad] = {}
        self.versions: dict[str, str] = {"llama-server": LLAMA_SERVER_VERSION}
        self._timer = Periodic("engine-watch", interval_s, self.poll)

    async def start(self) -> None:
        await self._timer.start()

    async def stop(self) -> None:
        await self._timer.stop()

    async def poll(self) -> None:
        """Ask every ready engine once; forget the figures of engines that are gone."""
        current = dict(self.engines)
        for model in [m for m in self.loads if m not in current]:
            del self.loads[model]
        if self.vllm_metrics is not None:
            for model in self.vllm_metrics.engines():
                if not isinstance(current.get(model), VllmEngine):
                    self.vllm_metrics.forget(model)
        servers: set[int] = set()
        for model, engine in current.items():
            try:
                async with asyncio.timeout(max(1.0, self.interval_s)):
                    load = await self._observe(engine, servers)
            except (QuorumError, TimeoutError) as exc:
                log.debug("model %s: no figures from its engine: %s", model, exc)
                self.loads.pop(model, None)
                continue
            if load is not None:
                self.loads[model] = load

    async def _observe(self, engine: Engine, servers: set[int]) -> EngineLoad | None:
        """1. vLLM: its `/metrics`. 2. ComfyUI: its server's `/queue`, the first model of a
        server only. 3. Other engines report nothing here."""
        if isinstance(engine, VllmEngine):  # 1
            scraped = await engine.scrape()
            if "vllm" not in self.versions:
                version = await engine.version()
                if version is not None:
                    self.versions["vllm"] = version
            return EngineLoad(
                engine.kv_size_mb, scraped.kv_cache_usage, scraped.waiting, scraped.running
            )
        if isinstance(engine, ComfyUIEngine):  # 2
            if id(engine.server) in servers:
                return EngineLoad()
            servers.add(id(engine.server))
            queue = await engine.client.queue()
            if "comfyui" not in self.versions:
                stats = await engine.client.system_stats()
                if stats.comfyui_version != "unknown":
                    self.versions["comfyui"] = stats.comfyui_version
            return EngineLoad(waiting=len(queue.pending), running=len(queue.running))
        return None  # 3

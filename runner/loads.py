"""Governed model loads and unloads: parse, approve, then run as tasks any replica can read.

    POST   /v1/models/load            → 202 {taskId, status: "loading", progress, eta} at once
    GET    /v1/models/load/{taskId}   → the task: queued | downloading | loading | completed
                                        (modelId, gpuMemoryUsedMB, loadTimeMs) | failed (error)
                                        | cancelled
    DELETE /v1/models/load/{taskId}   → governed (`task-cancel`): stops the load, frees it
    POST   /v1/models/unload          → governed: drain, stop, {modelId, gpuMemoryFreedMB,
                                        kvCacheFlushed} with memory measured

Every lifecycle call goes the way of `runner/lifecycle.py`: strict body parsing and
checks (400/404) before governance, so nothing is spent on a call that cannot run; then
`Lifecycle.approve`; then the work. A load of a model already loading joins its task.

The load itself (`_run`), in the background:
    1. download the repository into HF_HOME when it is not on disk (status downloading);
    2. ask the scheduler for the model: it makes room by its eviction policy (`evictModel`
       first; victims drain before they stop) and then has the pool start the engine;
    3. while the engine starts: status loading, progress and eta from the measured speed;
    4. completed with the measured memory and load time, or failed with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from faults import QuorumError
from runner.catalog import Roots, resolve
from runner.downloads import ByteMeter, fetch_snapshot
from runner.errors import BadRequest
from runner.lifecycle import Lifecycle, governed_request, parse_body
from runner.models_config import Backend, ModelSpec
from runner.pool.launch import LoadParams
from runner.pool.pool import ModelPool
from runner.pool.sizing import model_size_mb
from runner.pool.slot import UnloadResult
from runner.pool.states import ModelState
from runner.tasks import (
    LoadTask,
    TaskNotFound,
    TaskStatus,
    TaskStore,
    download_progress,
    eta_remaining,
    synthetic_progress,
)

log = logging.getLogger("quorum.loads")

QUANTIZATIONS = ("awq-4bit", "gptq-4bit", "fp16", "bf16")
_LOAD_FIELDS = frozenset(
    {
        "modelId",
        "quantization",
        "maxContextLength",
        "gpuMemoryBudgetMB",
        "evictModel",
        "verifiedOpToken",
    }
)
_UNLOAD_FIELDS = frozenset({"modelId", "verifiedOpToken", "mode"})
PROGRESS_EVERY_S = 0.5


@dataclass(frozen=True, slots=True)
class LoadRequest:
    model_id: str
    quantization: str | None
    max_context_length: int | None
    gpu_memory_budget_mb: int | None
    evict_model: str | None


def _opt_int(doc: dict[str, Any], key: str, low: int, high: int) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequest(f"{key} must be an integer from {low} to {high}")
    return value


def parse_load(doc: dict[str, Any]) -> LoadRequest:
    """The seed's load body, strictly: known fields, right types and ranges (400 otherwise)."""
    unknown = set(doc) - _LOAD_FIELDS
    if unknown:
        raise BadRequest(f"unknown field(s) in load request: {', '.join(sorted(unknown))}")
    model_id = doc.get("modelId")
    if not isinstance(model_id, str) or not model_id:
        raise BadRequest("modelId is required and must be a non-empty string")
    quantization = doc.get("quantization")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise BadRequest(f"quantization must be one of {', '.join(QUANTIZATIONS)}")
    evict = doc.get("evictModel")
    if evict is not None and (not isinstance(evict, str) or not evict):
        raise BadRequest("evictModel must be a non-empty string")
    return LoadRequest(
        model_id,
        quantization,
        _opt_int(doc, "maxContextLength", 1, 10_000_000),
        _opt_int(doc, "gpuMemoryBudgetMB", 1, 100_000_000),
        evict,
    )


class LoadManager:
    """Load tasks of one runner: created here, stored in the task store, run in the background."""

    def __init__(
        self,
        pool: ModelPool,
        lifecycle: Lifecycle,
        store: TaskStore,
        roots: Roots,
        backend: Backend,
        runner_id: str,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.pool = pool
        self.lifecycle = lifecycle
        self.store = store
        self.roots = roots
        self.backend = backend
        self.runner_id = runner_id
        self.estimator = pool.estimator  # learns from every load the pool makes
        self.on_finished: Callable[[str], None] = lambda _outcome: None  # metrics
        self.clock = clock
        self._running: dict[str, asyncio.Task[None]] = {}
        self.progress: dict[str, LoadTask] = {}  # model -> its active task (capabilities)

    async def start(self) -> None:
        """Tasks this runner left unfinished when it stopped read `failed` with that reason."""
        count = await self.store.mark_interrupted(self.runner_id, now=self.clock())
        if count:
            log.warning("%d load task(s) interrupted by the restart marked failed", count)

    async def aclose(self) -> None:
        for task in list(self._running.values()):
            task.cancel()
        for task in list(self._running.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- HTTP operations -------------------------------------------------------------

    async def submit(self, body: bytes, header_token: str | None) -> LoadTask:
        doc = parse_body(body)  # 1
        request = parse_load(doc)
        spec, download = resolve(
            request.model_id, self._specs(), self.roots, self.backend, request.quantization
        )
        if request.evict_model is not None and self.pool.spec(request.evict_model) is None:
            raise BadRequest(f"evictModel {request.evict_model!r} is not a model of this runner")
        governed = governed_request(doc, header_token)  # 2
        await self.lifecycle.approve("model-load", governed)  # 3
        now = self.clock()
        size_mb = model_size_mb(spec)
        eta = round(self.estimator.predict(spec.backend, size_mb), 1)
        task = LoadTask.new(
            spec.id,
            self.runner_id,
            now=now,
            eta=eta,
            quantization=request.quantization,
            max_context_length=request.max_context_length,
            gpu_memory_budget_mb=request.gpu_memory_budget_mb,
            evict_model=request.evict_model,
        )
        stored, created = await self.store.create_or_join(task)
        if created:  # 4
            self.pool.register(spec)
            self.progress[spec.id] = stored
            self._running[stored.task_id] = asyncio.get_running_loop().create_task(
                self._run(stored, spec, request, download), name=f"load-{spec.id}"
            )
        return stored

    async def get(self, task_id: str) -> LoadTask:
        task = await self.store.get(task_id)
        if task is None:
            raise TaskNotFound(taskId=task_id)
        return task

    async def cancel(self, task_id: str, body: bytes, header_token: str | None) -> LoadTask:
        task = await self.get(task_id)
        doc = parse_body(body) if body.strip() else {}
        unknown = set(doc) - {"verifiedOpToken"}
        if unknown:
            raise BadRequest(f"unknown field(s) in cancel request: {', '.join(sorted(unknown))}")
        doc = {**doc, "taskId": task_id}
        governed = governed_request({**doc, "modelId": task.model_id}, header_token)
        await self.lifecycle.approve("task-cancel", governed)
        cancelled = await self.store.put(task.cancel(now=self.clock()))
        running = self._running.get(task_id)
        if running is not None:
            running.cancel()
        return cancelled

    async def unload(self, body: bytes, header_token: str | None) -> UnloadResult:
        doc = parse_body(body)
        unknown = set(doc) - _UNLOAD_FIELDS
        if unknown:
            raise BadRequest(f"unknown field(s) in unload request: {', '.join(sorted(unknown))}")
        model_id = doc.get("modelId")
        if not isinstance(model_id, str) or not model_id:
            raise BadRequest("modelId is required and must be a non-empty string")
        mode = doc.get("mode", "stop")
        if mode not in ("stop", "sleep"):
            raise BadRequest("mode must be 'stop' or 'sleep'")
        self.pool.check_unloadable(model_id, mode)
        await self.lifecycle.approve("model-unload", governed_request(doc, header_token))
        return await self.pool.unload(model_id, mode)

    # -- the load, in the background ---------------------------------------------------

    def _specs(self) -> dict[str, ModelSpec]:
        return {m: slot.spec for m, slot in self.pool.slots.items()}

    async def _write(self, task: LoadTask) -> LoadTask:
        stored = await self.store.put(task)
        self.progress[task.model_id] = stored
        if stored.status.terminal:
            self.on_finished(stored.status.value)
        return stored

    async def _run(
        self, task: LoadTask, spec: ModelSpec, request: LoadRequest, download: str | None
    ) -> None:
        started = self.clock()
        model = spec.id
        try:
            if download is not None:  # 1
                task = await self._write(task.start_download(eta=task.eta, now=self.clock()))
                spec, task = await self._download(task, spec, download)
                if task.status.terminal:  # cancelled through another replica meanwhile
                    return
                self.pool.register(spec, replace=True)
            size_mb = model_size_mb(spec)
            predicted = self.estimator.predict(spec.backend, size_mb)
            params = LoadParams(
                request.max_context_length, request.quantization, request.gpu_memory_budget_mb
            )
            ready = self.pool.want(model, params, request.evict_model)  # 2
            loading_since: float | None = None
            base = task.progress  # what the download showed: the load fills the rest
            while not ready.done():  # 3
                await asyncio.wait({ready}, timeout=PROGRESS_EVERY_S)
                if ready.done():
                    break
                now = self.clock()
                if loading_since is None:
                    if self.pool.state(model) is not ModelState.LOADING:
                        continue  # the scheduler is still making room (victims drain)
                    loading_since = now
                    task = await self._write(task.start_loading(eta=round(predicted, 1), now=now))
                    continue
                elapsed = now - loading_since
                progress = synthetic_progress(elapsed, predicted)
                eta = eta_remaining(predicted, elapsed, progress)
                task = await self._write(
                    task.progress_to(base + (1.0 - base) * progress, eta=eta, now=now)
                )
                if task.status.terminal:  # cancelled through another replica
                    self.pool.cancel_load(model)
            result = ready.result()
            if task.status is not TaskStatus.LOADING:  # ready before the first progress write
                task = await self._write(task.start_loading(eta=0, now=self.clock()))
            load_ms = round(1000 * (self.clock() - started))
            await self._write(task.complete(result.gpu_memory_mb, load_ms, now=self.clock()))  # 4
        except asyncio.CancelledError:
            self.pool.cancel_load(model)
            with contextlib.suppress(QuorumError):
                current = await self.store.get(task.task_id)
                if current is not None and not current.status.terminal:
                    await self._write(current.cancel(now=self.clock()))
        except QuorumError as exc:
            await self._write(task.fail(str(exc), now=self.clock()))
        except Exception as exc:  # a bug must still end the task
            log.exception("load of %s failed unexpectedly", model)
            await self._write(task.fail(f"internal error: {type(exc).__name__}", now=self.clock()))
        finally:
            self._running.pop(task.task_id, None)
            self.progress.pop(model, None)

    async def _download(
        self, task: LoadTask, spec: ModelSpec, repo_id: str
    ) -> tuple[ModelSpec, LoadTask]:
        """Fetch `repo_id` into HF_HOME (huggingface_hub), writing the task's progress and
        eta from the bytes done every `PROGRESS_EVERY_S` (`download_progress`); offline or
        not found: a clear reason. The task as last written comes back with the model."""
        if self.roots.hf_home is None:
            raise ModelDownloadFailed(f"{repo_id}: not on disk and HF_HOME is not set")
        cache = self.roots.hf_home / "hub"
        patterns = ["*.gguf"] if spec.backend == "llama-server" else None
        meter = ByteMeter()
        fetch = asyncio.ensure_future(
            asyncio.to_thread(fetch_snapshot, repo_id, cache, patterns, meter)
        )
        # A cancelled task stops waiting; the thread still ends, and its outcome is nobody's.
        fetch.add_done_callback(lambda f: f.cancelled() or f.exception())
        started = self.clock()
        while not fetch.done():
            await asyncio.wait({fetch}, timeout=PROGRESS_EVERY_S)
            if fetch.done():
                break
            load_s = self.estimator.predict(spec.backend, meter.expected_mb())
            progress, eta = download_progress(meter.fraction(), self.clock() - started, load_s)
            task = await self._write(
                task.progress_to(progress, eta=task.eta if eta is None else eta, now=self.clock())
            )
            if task.status.terminal:  # the thread finishes the file; nothing will use it
                return spec, task
        try:
            local = fetch.result()
        except Exception as exc:  # huggingface_hub's errors, translated here once
            raise ModelDownloadFailed(
                f"{repo_id}: download failed ({type(exc).__name__}: {str(exc)[:300]})"
            ) from None
        resolved, _ = resolve(local, {}, self.roots, spec.backend, spec.quantization)
        return resolved.model_copy(update={"id": spec.id}), task


class ModelDownloadFailed(QuorumError):
    status = 502
    code = "model_download_failed"
    type = "server_error"

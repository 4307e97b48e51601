"""Governed model loads and unloads: parse, approve, then run as tasks any replica can read.

    POST   /v1/models/load            → 202 {taskId, status: "loading", progress, eta} at once
    GET    /v1/models/load/{taskId}   → the task: queued | downloading | loading | completed
                                        (modelId, gpuMemoryUsedMB, loadTimeMs) | failed (error)
                                        | cancelled
    DELETE /v1/models/load/{taskId}   → governed (`task-cancel`): stops the load, frees it
    POST   /v1/models/unload          → governed: drain, stop, {modelId, gpuMemoryFreedMB,
                                        kvCacheFlushed} with memory measured

Every lifecycle call goes the way of `runner/lifecycle/governed.py`: the body's shape
(400), `GovernedOps.approve`, and only then what it names (404/400) and the work. A load
of a model already loading joins its task.

A load, in the background (`_run`), follows the scheduler's notices for its model; the
one thing it reads meanwhile is its own task, every `CANCEL_CHECK_S`, to see a cancel
written by another replica (`_next`; the replica that runs the load stops it):
    1. download the repository into HF_HOME when it is not on disk (status downloading;
       progress written as huggingface_hub reports bytes, at most every PROGRESS_EVERY_S);
    2. ask the scheduler for the model (`request_load`): it makes room by its eviction
       policy (`evictModel` first; victims drain before they stop) and has the pool start
       the engine;
    3. the notice that it is loading: status loading, with the predicted load time as eta
       (progress then advances with time when read: `LoadTask.as_of`);
    4. the notice that it is ready: completed with the measured memory and load time; that
       it failed, or can never fit: failed with the reason; that it was called off:
       cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator

from faults import QuorumError
from runner.engines.record import UnloadResult
from runner.engines.sizing import model_size_mb
from runner.engines.specs import ModelSpecs
from runner.errors import BadRequest, ModelDownloadFailed
from runner.floor.models_file import ModelSpec
from runner.floor.pending_writes import RETRY_S, PendingWrites
from runner.lifecycle.catalog import Roots, resolve
from runner.lifecycle.downloads import ByteMeter, fetch_reporting
from runner.lifecycle.governed import GovernedOps, governed_request, parse_body
from runner.lifecycle.load_requests import UNLOAD_FIELDS, LoadRequest, parse_load
from runner.lifecycle.traced_tasks import stage, traced
from runner.scheduler import ModelNotice, ModelState, SchedulerAdmission
from runner.tasks import (
    EtaEstimator,
    LoadTask,
    TaskNotFound,
    TaskStatus,
    TaskStore,
    TaskStoreUnavailable,
    download_progress,
)

log = logging.getLogger("quorum.loads")

PROGRESS_EVERY_S = 0.5
CANCEL_CHECK_S = 1.0
"""While its engine starts, the owner reads its task this often: a cancel written by
another replica is seen within it (no write of the owner's is due before the engine is
ready, and replicas share nothing but the store)."""


class LoadManager:
    """Load tasks of one runner: created here, stored in the task store, run in the background."""

    def __init__(
        self,
        specs: ModelSpecs,
        admission: SchedulerAdmission,
        governed: GovernedOps,
        store: TaskStore,
        roots: Roots,
        estimator: EtaEstimator,
        runner_id: str,
        *,
        on_finished: Callable[[str], None] = lambda _outcome: None,
        clock: Callable[[], float] = time.time,
        cancel_check_s: float = CANCEL_CHECK_S,
        store_retry_s: float = RETRY_S,
    ) -> None:
        """`specs` is the catalog a load registers its model in (with what its start asks
        for); `estimator` the load times the pool measures (each task's eta);
        `on_finished(status)` counts each task that ended (metrics)."""
        self.specs = specs
        self.admission = admission
        self.governed = governed
        self.store = store
        self.roots = roots
        self.estimator = estimator
        self.runner_id = runner_id
        self.on_finished = on_finished
        self.clock = clock
        self._cancel_check_s = cancel_check_s
        self._running: dict[str, asyncio.Task[None]] = {}
        self._active: dict[str, LoadTask] = {}  # model -> its active task, as last written
        self._notices: dict[str, list[asyncio.Queue[ModelNotice]]] = {}
        self._unlisten: Callable[[], None] = lambda: None
        # A write the store refused while down is written again once it is back (the
        # load goes on meanwhile; its last write has no next one to carry it).
        self._writes: PendingWrites[LoadTask, LoadTask] = PendingWrites(
            store.put, TaskStoreUnavailable, "load task", retry_s=store_retry_s
        )

    async def start(self) -> None:
        """Follow the scheduler's notices; tasks this runner left unfinished when it
        stopped read `failed` with that reason."""
        self._unlisten = self.admission.listen(self._notice)
        count = await self.store.mark_interrupted(self.runner_id, now=self.clock())
        if count:
            log.warning("%d load task(s) interrupted by the restart marked failed", count)

    async def aclose(self) -> None:
        self._unlisten()
        for task in list(self._running.values()):
            task.cancel()
        for task in list(self._running.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._writes.aclose()

    def progress(self) -> dict[str, LoadTask]:
        """Each model's active task as of now (capabilities' `loading`)."""
        now = self.clock()
        return {model: task.as_of(now) for model, task in self._active.items()}

    # -- HTTP operations -------------------------------------------------------------

    async def submit(self, body: bytes, header_token: str | None) -> LoadTask:
        """Create (or join) the model's load task.

        1. Parse the body's shape (400); nothing here depends on what exists.
        2. Governance approves (401/403/409/...): only then is the model looked up, so a
           caller without a valid token learns nothing of what the model roots hold.
        3. What the model names: the catalog, the roots, the Hub (404/400).
        4. A new task starts the load; a load already under way is joined.
        """
        doc = parse_body(body)  # 1
        request = parse_load(doc)
        governed = governed_request(doc, header_token)  # 2
        await self.governed.approve("model-load", governed)
        kinds = self.specs.kinds
        known = self.specs.specs()
        backend = kinds.default_backend(list(known.values()))
        spec, download = resolve(  # 3
            request.model_id, known, self.roots, kinds, backend, request.quantization
        )
        if request.evict_model is not None and request.evict_model not in known:
            raise BadRequest(f"evictModel {request.evict_model!r} is not a model of this runner")
        now = self.clock()
        eta = round(self.estimator.predict(spec.backend, model_size_mb(spec)), 1)
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
            self.specs.register(spec, request.params())
            self._active[spec.id] = stored
            self._running[stored.task_id] = asyncio.get_running_loop().create_task(
                traced(self._run(stored, spec, request, download), stored), name=f"load-{spec.id}"
            )
        return stored.as_of(now)

    async def get(self, task_id: str) -> LoadTask:
        task = await self.store.get(task_id)
        if task is None:
            raise TaskNotFound(taskId=task_id)
        return task.as_of(self.clock())

    async def cancel(self, task_id: str, body: bytes, header_token: str | None) -> LoadTask:
        task = await self.get(task_id)
        doc = parse_body(body) if body.strip() else {}
        unknown = set(doc) - {"verifiedOpToken"}
        if unknown:
            raise BadRequest(f"unknown field(s) in cancel request: {', '.join(sorted(unknown))}")
        doc = {**doc, "taskId": task_id}
        governed = governed_request({**doc, "modelId": task.model_id}, header_token)
        await self.governed.approve("task-cancel", governed)
        cancelled = await self.store.put(task.cancel(now=self.clock()))
        running = self._running.get(task_id)
        if running is not None:
            running.cancel()
        return cancelled

    async def unload(self, body: bytes, header_token: str | None) -> UnloadResult:
        """Drain and stop a model (or put it to sleep); the memory freed, measured.

        1. Parse the body's shape (400).
        2. Approve; only then what cannot be unloaded is refused (404/400:
           `models.unload_refusal`, the scheduler's state), so a caller without a valid
           token learns nothing of which models exist; ask the scheduler; wait for its
           notice that the model is gone or asleep (the pool measured what that freed).
        """
        doc = parse_body(body)  # 1
        unknown = set(doc) - UNLOAD_FIELDS
        if unknown:
            raise BadRequest(f"unknown field(s) in unload request: {', '.join(sorted(unknown))}")
        model_id = doc.get("modelId")
        if not isinstance(model_id, str) or not model_id:
            raise BadRequest("modelId is required and must be a non-empty string")
        mode = doc.get("mode", "stop")
        if mode not in ("stop", "sleep"):
            raise BadRequest("mode must be 'stop' or 'sleep'")
        await self.governed.approve("model-unload", governed_request(doc, header_token))  # 2
        self.admission.check_unload(model_id, mode)
        done = (ModelState.ABSENT, ModelState.SLEEPING)
        with self._follow(model_id) as notices:
            self.admission.request_unload(model_id, sleep=mode == "sleep")
            while True:
                notice = await notices.get()
                if notice.view.state in done and notice.freed_mb is not None:
                    break
        freed = notice.freed_mb or 0
        slept = notice.view.state is ModelState.SLEEPING
        return UnloadResult(model_id, freed, True, "sleep" if slept else "stop")

    async def preload(self, spec: ModelSpec) -> ModelNotice:
        """Load `spec` (the operator's own models file: no token, no task) through the
        scheduler; the notice it ended with (ready, failed, or refused)."""
        model = spec.id
        with self._follow(model) as notices:
            self.admission.request_load(model, self.specs.policy(spec))
            while True:
                notice = await notices.get()
                view = notice.view
                if notice.refused is not None or view.state is ModelState.FAILED:
                    return notice
                if view.state is ModelState.READY and not view.unloading:
                    return notice

    # -- the load, in the background ---------------------------------------------------

    @contextlib.contextmanager
    def _follow(self, model: str) -> Iterator[asyncio.Queue[ModelNotice]]:
        """The scheduler's notices about `model`, as a queue, while in the block."""
        queue: asyncio.Queue[ModelNotice] = asyncio.Queue()
        self._notices.setdefault(model, []).append(queue)
        try:
            yield queue
        finally:
            queues = self._notices[model]
            queues.remove(queue)
            if not queues:
                del self._notices[model]

    def _notice(self, notice: ModelNotice) -> None:
        for queue in self._notices.get(notice.view.model, ()):
            queue.put_nowait(notice)

    async def _write(self, task: LoadTask) -> LoadTask:
        """Write `task`; what the store holds now (with the store down: `task`, written
        once the store is back)."""
        stored = await self._writes.write(task.task_id, task)
        if stored is None:
            stored = task
        self._active[task.model_id] = stored
        stage(stored)  # an event on the task's span (tracing on)
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
                self.specs.register(spec)  # its files are on disk now
            predicted = round(self.estimator.predict(spec.backend, model_size_mb(spec)), 1)
            policy = self.specs.policy(spec, request.gpu_memory_budget_mb)
            with self._follow(model) as notices:
                self.admission.request_load(model, policy, request.evict_model)  # 2
                while not task.status.terminal:
                    event = await self._next(task, notices)
                    if isinstance(event, LoadTask):  # ended by another replica meanwhile
                        task = event
                        break
                    task = await self._advance(task, event, predicted, started)  # 3, 4
            if task.status is TaskStatus.CANCELLED:  # here: a cancel by another replica
                self._call_off(model)
        except asyncio.CancelledError:
            self.admission.cancel_load(model)
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
            if self._active.get(model) is task or task.status.terminal:
                self._active.pop(model, None)

    async def _next(
        self, task: LoadTask, notices: asyncio.Queue[ModelNotice]
    ) -> ModelNotice | LoadTask:
        """The next notice about the task's model or, should the store read the task
        ended first (cancelled on another replica), that record; the store is read every
        `cancel_check_s` (a failed read is tried again at the next)."""
        getter = asyncio.ensure_future(notices.get())
        try:
            while True:
                done, _ = await asyncio.wait({getter}, timeout=self._cancel_check_s)
                if done:
                    return getter.result()
                with contextlib.suppress(QuorumError):
                    current = await self.store.get(task.task_id)
                    if current is not None and current.status.terminal:
                        return current
        finally:
            getter.cancel()

    def _call_off(self, model: str) -> None:
        """The task was cancelled on another replica: stop the load here, or unload the
        model where it became ready before this runner saw the cancel (a cancel frees
        what the load took)."""
        view = self.admission.models().get(model)
        if view is not None and view.state is ModelState.READY and not view.unloading:
            self.admission.request_unload(model)
        else:
            self.admission.cancel_load(model)

    async def _advance(
        self, task: LoadTask, notice: ModelNotice, predicted: float, started: float
    ) -> LoadTask:
        """Steps 3-4: one notice about the task's model, the task written accordingly."""
        view, now = notice.view, self.clock()
        if notice.refused is not None:
            return await self._write(task.fail(notice.refused, now=now))
        if view.state is ModelState.LOADING:
            return await self._write(task.start_loading(eta=predicted, now=now))
        if view.state is ModelState.READY and not view.unloading:
            if task.status is not TaskStatus.LOADING:
                task = task.start_loading(eta=0, now=now)
            load_ms = round(1000 * (now - started))
            return await self._write(task.complete(view.mem_mb, load_ms, now=now))
        if view.state is ModelState.FAILED:
            return await self._write(task.fail(view.reason or "the load failed", now=now))
        if view.state is ModelState.ABSENT and task.status is TaskStatus.LOADING:
            return await self._write(task.cancel(now=now, reason="the load was called off"))
        return task

    async def _download(
        self, task: LoadTask, spec: ModelSpec, repo_id: str
    ) -> tuple[ModelSpec, LoadTask]:
        """Fetch `repo_id` into HF_HOME (huggingface_hub), writing the task's progress and
        eta from the bytes done as the download reports them, at most every
        `PROGRESS_EVERY_S` (`download_progress`); offline or not found: a clear reason. The
        task as last written comes back with the model."""
        if self.roots.hf_home is None:
            raise ModelDownloadFailed(f"{repo_id}: not on disk and HF_HOME is not set")
        cache = self.roots.hf_home / "hub"
        kinds = self.specs.kinds
        found = kinds.of(spec).traits.download_patterns
        patterns = list(found) if found is not None else None
        started = self.clock()
        written = task

        async def report(meter: ByteMeter, now: float) -> bool:
            nonlocal written
            load_s = self.estimator.predict(spec.backend, meter.expected_mb())
            progress, eta = download_progress(meter.fraction(), now - started, load_s)
            eta = written.eta if eta is None else eta
            written = await self._write(written.progress_to(progress, eta=eta, now=now))
            return written.status.terminal  # the thread finishes the file; nobody uses it

        try:
            local = await fetch_reporting(
                repo_id, cache, patterns, report, self.clock, PROGRESS_EVERY_S
            )
        except Exception as exc:  # huggingface_hub's errors, translated here once
            raise ModelDownloadFailed(
                f"{repo_id}: download failed ({type(exc).__name__}: {str(exc)[:300]})"
            ) from None
        if local is None:  # the task ended meanwhile (cancelled through another replica)
            return spec, written
        resolved, _ = resolve(local, {}, self.roots, kinds, spec.backend, spec.quantization)
        return resolved.model_copy(update={"id": spec.id}), written

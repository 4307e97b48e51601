"""`POST /v1/images/generations` in OpenAI's shape, served by a ComfyUI workflow.

Request (OpenAI's fields, parsed in `adapters/image_request.py`): `prompt` (required),
`model` (the runner's model id, whose checkpoint and workflow template the models file
names), `n` (1-10, the template's `batch_size`), `size` (`"WxH"` or `"auto"`),
`response_format` (`b64_json`, the default here as for gpt-image-1, or `url`). `quality`,
`style`, `user`, `background`, `moderation` and `output_compression` are accepted and have
no effect; `output_format` must be `png` when given. Runner extensions: `x_seed`,
`x_negative_prompt`, `x_steps`, `x_cfg` (used when the model's template declares `seed`,
`negative_prompt`, `steps`, `cfg`), and `webhook` (async jobs). Anything else is refused,
as OpenAI does.

Answer: `{"created": <unix time>, "data": [{"b64_json": ...} | {"url": ...}, ...]}`, one
entry per image the workflow saved.

`generate` is one coroutine for both forms: the synchronous request awaits it, and the
async form hands `job_work(...)` to the job manager (`runner/jobs`), whose progress
callback (`Report`) then receives progress in workflow nodes (`JobView.progress`).
Cancelling it (client gone, `DELETE /v1/jobs/{id}`) removes the prompt from ComfyUI's queue
or interrupts it (`follow.run`). An interrupt acts only when ComfyUI's running node ends, so
the caller's slot is not free then: `generate` hands the caller (`release_when`) the moment
ComfyUI lets the prompt go, and the runner keeps the slot until it (step 9).

Nothing of a job stays behind at ComfyUI: its images are saved in a folder of the job's
own and removed once read (or, for a job that failed or was cancelled, once ComfyUI no
longer runs it), and its history entry is deleted. The images handed out carry no text
chunks (ComfyUI puts the whole graph, prompt included, in each PNG) unless the operator
keeps them (`keep_metadata`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from adapters.comfyui.client import ComfyUIClient, new_prompt_id
from adapters.comfyui.errors import (
    ExecutionFailed,
    ExecutionInterrupted,
)
from adapters.comfyui.events import ImageRef, JobView
from adapters.comfyui.follow import Finished, FollowTiming, run
from adapters.comfyui.png_text import without_text_chunks
from adapters.comfyui.server import JOBS_FOLDER, job_folders
from adapters.comfyui.template_checks import seed_range
from adapters.comfyui.workflows import Value, WorkflowTemplate
from adapters.errors import (
    EngineBadResponse,
    EngineCrashed,
    EngineError,
    EngineSilent,
    EngineUnavailable,
    InvalidImageRequest,
)
from adapters.image_request import ImageRequest
from adapters.image_store import ImageStore, file_path
from adapters.images import Generated, ReleaseWhen, Report

log = logging.getLogger("quorum.comfyui")


class ModelShape(Protocol):
    """What checking a request needs of a ComfyUI model: its template and checkpoint (known
    from the models file before the model is loaded)."""

    @property
    def model_id(self) -> str: ...

    @property
    def template(self) -> WorkflowTemplate: ...

    @property
    def checkpoint(self) -> str | None: ...


class ImageModel(ModelShape, Protocol):
    """What generation needs of a loaded ComfyUI model (`engine.ComfyUIEngine`)."""

    @property
    def client(self) -> ComfyUIClient: ...

    def ensure_ready(self) -> None:
        """Raise unless the model is loaded."""
        ...

    async def died_within(self, seconds: float) -> str | None:
        """How ComfyUI died if its process ends within `seconds`, else None."""
        ...

    async def discard_outputs(self, folder: str) -> bool:
        """Remove one job's folder from ComfyUI's output folder."""
        ...


def workflow_values(
    model: ModelShape, request: ImageRequest, seed: int, prefix: str
) -> dict[str, Value]:
    """The template parameters for `request` (pure).

    1. Always: `filename_prefix`; `checkpoint` and `seed` when the template declares them;
       `x_seed` for a template without a seed: 400, as any undeclared `x_*` field.
    2. `prompt` when declared (a model-free template ignores it).
    3. `n` > 1 and `size` need `batch_size` / `width` and `height`: 400 if not declared.
    4. Each extension needs its parameter declared: 400 naming it.
    """
    params = model.template.params
    values: dict[str, Value] = {"filename_prefix": prefix}  # 1
    if "checkpoint" in params and model.checkpoint is not None:
        values["checkpoint"] = model.checkpoint
    if "seed" in params:
        values["seed"] = seed
    elif request.seed is not None:
        raise InvalidImageRequest(f"model {model.model_id!r} does not take x_seed")
    if "prompt" in params:  # 2
        values["prompt"] = request.prompt
    if "batch_size" in params:  # 3
        values["batch_size"] = request.n
    elif request.n != 1:
        raise InvalidImageRequest(f"model {model.model_id!r} makes one image per request")
    if request.size is not None:
        if "width" not in params or "height" not in params:
            raise InvalidImageRequest(f"model {model.model_id!r} has a fixed size")
        values["width"], values["height"] = request.size
    for name, value in request.extras.items():  # 4
        if name not in params:
            raise InvalidImageRequest(f"model {model.model_id!r} does not take x_{name}")
        values[name] = value
    return values


CRASH_GRACE_S = 2.0
"""How long a lost connection waits for ComfyUI's process to be seen exiting."""


class ImageGenerator:
    """Runs image requests on ComfyUI models; one per runner."""

    def __init__(
        self,
        store: ImageStore | None = None,
        timing: FollowTiming | None = None,
        clock: Callable[[], float] = time.time,
        seeds: Callable[[int, int], int] = lambda low, high: (
            low + secrets.randbelow(high - low + 1)
        ),
        keep_metadata: bool = False,
        settle_poll_s: float = 0.2,
        settle_limit_s: float = 600.0,
        release_s: float = 30.0,
    ) -> None:
        """`seeds(low, high)`: a seed drawn from low..high, for a request without `x_seed`
        (the template's seed bounds: `template_checks.seed_range`). `release_s`: how long
        a prompt given up on for its silence may take to leave ComfyUI before its slot is
        freed anyway (`generate` step 8). A cancelled prompt's slot waits for it at most
        the silence bound (`timing.silence_s`, else `settle_limit_s`; step 9).
        `settle_poll_s`: how often `/queue` is read meanwhile."""
        self.store = store
        self.timing = timing or FollowTiming()
        self.keep_metadata = keep_metadata
        self.settle_poll_s = settle_poll_s
        self.settle_limit_s = settle_limit_s
        self.release_s = release_s
        self.hold_s = self.timing.silence_s or settle_limit_s
        self._clock = clock
        self._seeds = seeds
        self._cleanups: set[asyncio.Task[None]] = set()

    async def generate(
        self,
        model: ImageModel,
        request: ImageRequest,
        progress: Report | None = None,
        url_for: Callable[[str], str] = file_path,
        release_when: ReleaseWhen | None = None,
        sampling: Callable[[float], None] | None = None,
        store: ImageStore | None = None,
    ) -> Generated:
        """Render, submit, follow, fetch; the OpenAI answer.

        1. The model must be loaded; `url` needs an image store (`store`, else the
           generator's).
        2. Render the template (400 on a bad parameter); the job saves into an output
           folder of its own (`quorum/<job>/`).
        3. Run it (`follow.run`); progress goes to `progress` as it comes, the sampler's
           steps to `sampling` (0..1: the admission scope's `progress`, for the forecast).
        4. The verdict: an execution error or an interrupt by someone else fail (502);
           success without a saved image is a bad response.
        5. Fetch every image with `/view`, its text chunks dropped unless `keep_metadata`;
           base64, or kept in the store for `url` (and removed there after the TTL).
        6. Remove ComfyUI's copies: the job's output folder and the prompt's history
           entry; for a job that did not end normally, in the background once ComfyUI no
           longer runs its prompt.
        7. ComfyUI unreachable because its process died: `EngineCrashed` with its exit
           code or signal, not a connection error.
        8. Silent too long (`EngineSilent`, 504; `follow.run` removed or interrupted the
           prompt): the error waits until ComfyUI no longer runs the prompt, at most
           `release_s`, so the slot it frees finds ComfyUI free. ComfyUI acts on an
           interrupt only between nodes and in progress hooks; without this wait the next
           prompt would be handed to ComfyUI while the node finishes, and wait inside it.
        9. Cancelled, or failed before its end (`follow.run` removed or interrupted the
           prompt; it may still be running its node): `release_when` gets the moment
           ComfyUI no longer runs or queues it (at most `hold_s`), so the caller's slot is
           held until then and the next request waits in the runner, not inside ComfyUI.
        """
        model.ensure_ready()  # 1
        kept = store or self.store
        if request.response_format == "url" and kept is None:
            raise InvalidImageRequest("response_format 'url' is not enabled on this runner")
        seed = self.seed_for(model, request)
        token = secrets.token_hex(8)
        graph = self._render(model, request, seed, f"{JOBS_FOLDER}/{token}/img")  # 2
        total = model.template.node_count
        prompt_id = new_prompt_id()
        ended = False

        async def on_view(view: JobView) -> None:
            if sampling is not None and (done := view.sampling()) is not None:
                sampling(done)
            if progress is not None and view.started:
                await progress(*view.progress(total))

        try:
            finished = await run(model.client, graph, on_view, self.timing, prompt_id)  # 3
            ended, prompt_id = True, finished.prompt_id
            images = _verdict(model.model_id, finished)  # 4
            data = [await self._answer(model, ref, request, url_for, kept) for ref in images]  # 5
        except BaseException as exc:
            silent = isinstance(exc, EngineSilent)
            if silent:  # 8
                await self._let_go(model, prompt_id)
            left = self._clean_up_later(model, graph, token, prompt_id, ended)  # 6
            if not ended and not silent and release_when is not None:  # 9
                release_when(self._slot_free(left, prompt_id))
            if isinstance(exc, EngineUnavailable):  # 7
                how = await model.died_within(CRASH_GRACE_S)
                if how is not None:
                    raise EngineCrashed(
                        f"{how} during the generation for model {model.model_id!r}"
                    ) from None
            raise
        await self._clean_up(model, graph, token, prompt_id)  # 6
        body = {"created": int(self._clock()), "data": data}
        return Generated(body, prompt_id, finished.engine_ms)

    def check(self, model: ModelShape, request: ImageRequest) -> None:
        """Everything `generate` would refuse with 400 before it reaches ComfyUI (pure), but
        a `url` answer without a store (the runner's path refuses that itself): an async
        request runs it before its 202, so it is refused as the synchronous one is."""
        seeds = seed_range(model.template)
        seed = request.seed if request.seed is not None else seeds[0] if seeds else 0
        self._render(model, request, seed, f"{JOBS_FOLDER}/check/img")

    def seed_for(self, model: ModelShape, request: ImageRequest) -> int:
        """The request's `x_seed`, else one drawn within the bounds of every input the
        template's seed feeds (0 for a template without a seed: it is not used)."""
        if request.seed is not None:
            return request.seed
        seeds = seed_range(model.template)
        return self._seeds(*seeds) if seeds is not None else 0

    def _render(
        self, model: ModelShape, request: ImageRequest, seed: int, prefix: str
    ) -> dict[str, Any]:
        """The graph for `request` (400 on a parameter the model's workflow refuses)."""
        return model.template.render(workflow_values(model, request, seed, prefix))

    async def _answer(
        self,
        model: ImageModel,
        ref: ImageRef,
        request: ImageRequest,
        url_for: Callable[[str], str],
        store: ImageStore | None,
    ) -> dict[str, str]:
        content = await model.client.view(ref)
        if not content:
            raise EngineBadResponse(f"ComfyUI returned an empty image {ref.filename!r}")
        if not self.keep_metadata:
            content = without_text_chunks(content)
        if request.response_format == "b64_json":
            return {"b64_json": base64.b64encode(content).decode("ascii")}
        assert store is not None
        return {"url": url_for(await store.keep(content))}

    async def _clean_up(
        self, model: ImageModel, graph: Mapping[str, Any], token: str, prompt_id: str
    ) -> None:
        for folder in sorted(job_folders(graph, token)):
            await model.discard_outputs(folder)
        with contextlib.suppress(EngineError):
            await model.client.delete_history([prompt_id])

    def _clean_up_later(
        self,
        model: ImageModel,
        graph: Mapping[str, Any],
        token: str,
        prompt_id: str,
        ended: bool,
    ) -> asyncio.Future[None]:
        """Clean up in the background; the future completes once ComfyUI let the prompt go."""
        left: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(
            self._settle_then_clean(model, graph, token, prompt_id, ended, left)
        )
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)
        return left

    async def _settle_then_clean(
        self,
        model: ImageModel,
        graph: Mapping[str, Any],
        token: str,
        prompt_id: str,
        ended: bool,
        left: asyncio.Future[None],
    ) -> None:
        """Wait until ComfyUI no longer runs or queues the prompt (it may still write its
        images), at most `settle_limit_s`; ComfyUI unreachable ends the wait. Then `left`
        completes, and the prompt's files and history go."""
        try:
            if not ended:
                await self._left(model, prompt_id, self.settle_limit_s)
        finally:
            if not left.done():
                left.set_result(None)
        try:
            await self._clean_up(model, graph, token, prompt_id)
        except Exception as exc:
            log.warning("prompt %s: its outputs could not be removed: %s", prompt_id, exc)

    async def _left(self, model: ImageModel, prompt_id: str, limit_s: float) -> bool:
        """Whether ComfyUI no longer runs or queues `prompt_id` (or cannot be asked) within
        `limit_s`, read from `/queue` every `settle_poll_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while True:
            try:
                queue = await model.client.queue()
            except EngineError:
                return True
            if prompt_id not in queue.running and prompt_id not in queue.pending:
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(self.settle_poll_s)

    async def _slot_free(self, left: asyncio.Future[None], prompt_id: str) -> None:
        """Step 9: return once ComfyUI let the prompt go (`left`), at most `hold_s`."""
        try:
            async with asyncio.timeout(self.hold_s):
                await asyncio.shield(left)
        except TimeoutError:
            log.error(
                "prompt %s: ComfyUI still runs it %g s after it was cancelled (a node that "
                "does not return?); its slot is given back, the next prompts wait behind it "
                "at ComfyUI",
                prompt_id,
                self.hold_s,
            )

    async def _let_go(self, model: ImageModel, prompt_id: str) -> None:
        """Step 8."""
        if not await self._left(model, prompt_id, self.release_s):
            log.error(
                "prompt %s: ComfyUI still runs it %g s after it was interrupted (a node "
                "that does not return?); the next prompts wait behind it at ComfyUI",
                prompt_id,
                self.release_s,
            )


def _verdict(model_id: str, finished: Finished) -> tuple[Any, ...]:
    outcome = finished.outcome
    if outcome.verdict == "error":
        detail = outcome.failure.describe() if outcome.failure else "no detail in its history"
        raise ExecutionFailed(f"ComfyUI failed the workflow of model {model_id!r}: {detail}")
    if outcome.verdict == "interrupted":
        raise ExecutionInterrupted(
            f"the generation for model {model_id!r} was interrupted at ComfyUI"
        )
    if not outcome.images:
        raise EngineBadResponse(f"the workflow of model {model_id!r} saved no image")
    return outcome.images

"""The image routes on the runner: `POST /v1/images/generations` and the image files.

The handlers are in `runner/http/images/handler.py` (`ImagesPath`, `ImageFiles`); this builds
them on the gate the front-end hands its paths, the pool and jobs; the front-end's `path`
(`mount`) makes `ImagesPath.serve` the route. `ImagesPath` routes by `model` among
the pool's ready engines with an image facet (`ReadyEngines.images`, adapters/images.py):
a live view, kept current by the pool like the chat path's; a model not loaded yet is
checked against what its kind says of it (`EngineKind.image_shape`). What a request for
a model that is not ready meets is the front-end's and the scheduler's answer (a model of
another backend is 400, one that is not loaded 404, ...).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from adapters.image_store import ImageStore
from adapters.images import ImageShape
from runner.engines.pool import ModelPool
from runner.floor.settings import Settings
from runner.http.asgi import ASGIApp
from runner.http.call import Serve
from runner.http.images.handler import ImageFiles, ImagesPath
from runner.http.path_gate import PathGate
from runner.jobs.http import JobSubmitter

log = logging.getLogger("quorum.images")


@dataclass(frozen=True, slots=True)
class ImageRoutes:
    images: ASGIApp  # `ImagesPath.serve` behind the front-end (POST only: the app's check)
    files: ImageFiles | None  # None: no image is kept (`response_format: url` refused)
    store: ImageStore | None


def image_routes(
    gate: PathGate,
    mount: Callable[[Serve], ASGIApp],
    pool: ModelPool,
    settings: Settings,
    submit_job: JobSubmitter,
    *,
    keep_files: bool,
    count_images: Callable[[str, str, int], None] = lambda _model, _tenant, _n: None,
) -> ImageRoutes:
    """The handlers, `ImagesPath` asking `gate` and mounted by `mount` (the front-end's
    `path`: every request through the front-end, then the path); with `keep_files` (the
    runner has image models) an image store in IMAGES_DIR (else a folder of its own under
    the temporary folder) for `response_format: url`, the runner's own (`ImageStore`: those
    left by a killed runner are removed)."""
    s = settings
    store = None
    if keep_files:
        store = (
            ImageStore(Path(s.images_dir).expanduser(), s.images_url_ttl_s)
            if s.images_dir
            else ImageStore.temporary(s.images_url_ttl_s)
        )
    models = pool.ready.images
    images = ImagesPath(
        gate,
        models,
        store,
        s.max_body_bytes,
        submit_job=submit_job,
        public_url=s.images_public_url,
        count_images=count_images,
        shape_of=lambda model: _shape(pool, model),
        job_inline_max_bytes=s.job_result_inline_max_bytes,
    )
    files = ImageFiles(store) if store is not None else None
    return ImageRoutes(mount(images.serve), files, store)


def _shape(pool: ModelPool, model: str) -> ImageShape | None:
    """What `model`'s requests are checked and weighed against: the loaded model's, else
    its kind's from its spec (an image model not loaded yet)."""
    engine = pool.ready.images.get(model)
    if engine is not None:
        return engine.shape
    spec = pool.specs.spec(model)
    if spec is None:
        return None
    kind = pool.kinds.of(spec)
    if kind.traits.request_path != "images":
        return None
    return kind.image_shape(pool.kinds.engine_spec(spec))


async def sweep_forever(store: ImageStore, every_s: float = 300.0) -> None:
    """Remove expired images (and files no token points to) now and then."""
    while True:
        try:
            removed = await asyncio.to_thread(store.sweep)
        except OSError as exc:
            log.warning("image store sweep failed: %s", exc)
        else:
            if removed:
                log.info("image store: %d expired image(s) removed", removed)
        await asyncio.sleep(every_s)


async def close_images(store: ImageStore) -> None:
    """Remove the images kept for URLs: they die with the runner that served them."""
    removed = await asyncio.to_thread(store.close)
    log.info("image store closed: %d image(s) removed", removed)

"""The image routes on the runner: `POST /v1/images/generations` and the image files.

The handlers are in `runner/images/handler.py` (`ImagesPath`,
`ImageFiles`); this builds them on the runner's pool, scheduler, limiter and jobs.

`ImagesPath` routes `POST /v1/images/generations` by `model`
among `ImageModels(pool.engines)`: a live view, kept current by the pool like the data
path's engine map. A model of another backend is a 400 (it does not generate images); a
ComfyUI model that is not ready answers as the data path would (`ModelPool.route_missing`:
404 not loaded, 503 failed, or a wait in the queue while it loads).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from adapters.base import Engine
from adapters.comfyui.engine import ComfyUIEngine
from adapters.comfyui.images import ImageGenerator
from adapters.comfyui.store import ImageStore
from runner.admission import Admission
from runner.errors import BadRequest
from runner.images.handler import ImageFiles, ImagesPath, JobSubmitter
from runner.metrics import Metrics
from runner.pool.pool import ModelPool
from runner.settings import Settings
from tenants.config import TenantsConfig
from tenants.ratelimit import RateLimiter

log = logging.getLogger("quorum.images")


class ImageModels(Mapping[str, ComfyUIEngine]):
    """The ComfyUI engines among `engines`, read live."""

    def __init__(self, engines: Mapping[str, Engine]) -> None:
        self.engines = engines

    def __getitem__(self, model: str) -> ComfyUIEngine:
        engine = self.engines[model]
        if not isinstance(engine, ComfyUIEngine):
            raise KeyError(model)
        return engine

    def __iter__(self) -> Iterator[str]:
        return (m for m, e in list(self.engines.items()) if isinstance(e, ComfyUIEngine))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def image_route_missing(pool: ModelPool) -> Callable[[str], None]:
    """`route_missing` for the image path: 400 for a model that does not generate images,
    else the pool's answer for a model with no ready engine."""

    def route_missing(model: str) -> None:
        spec = pool.spec(model)
        if spec is not None and spec.backend != "comfyui":
            raise BadRequest(
                f"model {model!r} does not generate images (backend {spec.backend}); "
                "image models on this runner: "
                + (
                    ", ".join(
                        sorted(m for m, s in pool.slots.items() if s.spec.backend == "comfyui")
                    )
                    or "none"
                )
            )
        pool.route_missing(model)

    return route_missing


@dataclass(frozen=True, slots=True)
class ImageRoutes:
    images: ImagesPath
    files: ImageFiles | None  # None: no image is kept (`response_format: url` refused)
    store: ImageStore | None


def image_routes(
    pool: ModelPool,
    admission: Admission,
    limiter: RateLimiter,
    tenants: TenantsConfig,
    metrics: Metrics,
    settings: Settings,
    submit_job: JobSubmitter,
    *,
    keep_files: bool,
) -> ImageRoutes:
    """The handlers; with `keep_files` (the runner has ComfyUI models) an image store in
    IMAGES_DIR (else a fresh temporary directory) for `response_format: url`."""
    s = settings
    store = None
    if keep_files:
        directory = s.images_dir or tempfile.mkdtemp(prefix="quorum-images-")
        store = ImageStore(Path(directory).expanduser(), s.images_url_ttl_s)
    images = ImagesPath(
        ImageModels(pool.engines),
        ImageGenerator(store),
        admission,
        limiter,
        tenants,
        metrics,
        s.max_body_bytes,
        multi_tenant=s.enable_multi_tenant,
        route_missing=image_route_missing(pool),
        submit_job=submit_job,
        public_url=s.images_public_url,
    )
    return ImageRoutes(images, ImageFiles(store) if store is not None else None, store)


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

"""ComfyUI's images facet (adapters/images.py): a model's shape (its workflow template and
checkpoint: what its requests are checked and weighed against, loaded or not) and a loaded
model's generation, on the kind's one `ImageGenerator`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from adapters.comfyui.engine import ComfyUIEngine
from adapters.comfyui.image_costs import image_cost, image_work
from adapters.comfyui.images import ImageGenerator
from adapters.comfyui.workflows import WorkflowTemplate
from adapters.image_request import ImageRequest
from adapters.image_store import ImageStore, file_path
from adapters.images import Generated, ReleaseWhen, Report


@dataclass(frozen=True, slots=True)
class ComfyShape:
    """A ComfyUI model as its workflow describes it (`images.ModelShape`, `ImageShape`)."""

    model_id: str
    template: WorkflowTemplate
    checkpoint: str | None
    generator: ImageGenerator

    def check(self, request: ImageRequest) -> None:
        self.generator.check(self, request)

    def cost(self, request: ImageRequest) -> int:
        return image_cost(self.template, request)

    def work(self, request: ImageRequest) -> float:
        return image_work(self.template, request)


class ComfyImages:
    """A loaded ComfyUI model's images facet (`ImagesEngine`)."""

    def __init__(self, engine: ComfyUIEngine, generator: ImageGenerator) -> None:
        self.engine = engine
        self.generator = generator
        self.shape = ComfyShape(engine.model_id, engine.template, engine.checkpoint, generator)

    async def generate(
        self,
        request: ImageRequest,
        store: ImageStore | None,
        progress: Report | None = None,
        url_for: Callable[[str], str] = file_path,
        release_when: ReleaseWhen | None = None,
        sampling: Callable[[float], None] | None = None,
    ) -> Generated:
        return await self.generator.generate(
            self.engine, request, progress, url_for, release_when, sampling, store
        )

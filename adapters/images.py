"""The images facet: what the image path (runner/http/images/) asks of an engine that generates
images, whatever its kind, and the data that crosses between them.

An image kind (`Traits.request_path == "images"`) hands the pool a `Launched` whose
`images` is an `ImagesEngine`; for a model not loaded yet the kind answers its
`ImageShape` itself (`EngineKind.image_shape`), so requests are checked and weighed
before they wait for a load. The request is OpenAI's (`adapters/image_request.py`); the
images answered as URLs are kept in the runner's store (`adapters/image_store.py`), which
the path hands to each generation.

Pure data and protocols; no I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from adapters.image_request import ImageRequest
from adapters.image_store import ImageStore, file_path

Report = Callable[[float, float | None], Awaitable[None]]
"""`report(done, total)`: progress in the kind's own units (a job's progress reporter fits)."""
ReleaseWhen = Callable[[Awaitable[object]], None]
"""`release_when(let_go)`: keep the request's slot until `let_go` completes (the admission
scope's `release_when`)."""


@dataclass(frozen=True, slots=True)
class Generated:
    """One generation's answer: OpenAI's body (`created`, `data`), the engine's id for it,
    and its time on it."""

    body: dict[str, Any]
    prompt_id: str
    engine_ms: int


class ImageShape(Protocol):
    """What an image model's requests are checked and weighed against, loaded or not."""

    @property
    def model_id(self) -> str: ...

    def check(self, request: ImageRequest) -> None:
        """Refuse (400) what a generation would refuse before it reaches the engine."""
        ...

    def cost(self, request: ImageRequest) -> int:
        """The request's scheduling cost in token-equivalents (the fair share charges it)."""
        ...

    def work(self, request: ImageRequest) -> float:
        """The request's work (the unit the wait forecast times per model)."""
        ...


class ImagesEngine(Protocol):
    """One loaded image model, on the image path (`/v1/images/generations`)."""

    @property
    def shape(self) -> ImageShape: ...

    async def generate(
        self,
        request: ImageRequest,
        store: ImageStore | None,
        progress: Report | None = None,
        url_for: Callable[[str], str] = file_path,
        release_when: ReleaseWhen | None = None,
        sampling: Callable[[float], None] | None = None,
    ) -> Generated:
        """Generate `request`'s images; `store` keeps those answered as URLs (None: a `url`
        answer is refused). `progress` as it comes, the sampling's share done to
        `sampling` (0..1); a generation cancelled or failed early hands `release_when` the
        moment the engine let it go."""
        ...

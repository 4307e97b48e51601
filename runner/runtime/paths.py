"""The request paths the runtime holds (runner/runtime/wiring.py): the chat, audio and image
paths, peers under runner/http/, each handed the gate the front-end keeps for its paths
(`FrontEnd.gate`, runner/http/path_gate.py) and mounted on the front-end (`FrontEnd.path`:
the front-end calls the path's `serve`, the path never calls back), each reading the pool's
ready engines of its own kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from runner.engines.pool import ModelPool
from runner.engines.specs import ModelSpecs
from runner.floor.models_file import ModelsFile
from runner.floor.settings import Settings
from runner.http.asgi import ASGIApp
from runner.http.audio.handler import AudioPath
from runner.http.audio.multipart import FormLimits
from runner.http.chat import ChatPath
from runner.http.frontend import FrontEnd
from runner.http.images.routes import ImageRoutes, image_routes
from runner.jobs.http import Ended, job_submitter
from runner.jobs.manager import JobManager
from runner.telemetry.metrics import Metrics


@dataclass(frozen=True, slots=True)
class RequestPaths:
    chat: ASGIApp
    audio: ASGIApp
    images: ImageRoutes


def request_paths(
    front: FrontEnd,
    pool: ModelPool,
    specs: ModelSpecs,
    models: ModelsFile,
    settings: Settings,
    metrics: Metrics,
    jobs: JobManager,
    *,
    job_ended: Ended,
    count_images: Callable[[str, str, int], None],
) -> RequestPaths:
    """The three paths on `front`; the audio and image paths take async jobs on `jobs`
    (`job_ended`: told how each ended, the usage); the image store is kept when the models
    file names an image model."""
    s, ready, records, gate = settings, pool.ready, pool.records, front.gate
    chat = ChatPath(
        gate,
        ready.chat,
        metrics,
        s.max_body_bytes,
        context_of=lambda m: r.context_length if (r := records.get(m)) else None,
        adapters=pool.adapters,
        fields_of=specs.request_fields,
        counters=ready.tokens,
    )
    audio = AudioPath(
        gate,
        ready.speech,
        metrics,
        FormLimits(max_file_bytes=s.audio_max_bytes),
        submit_job=job_submitter(jobs, job_ended),
    )
    images = any(specs.kind(m).traits.request_path == "images" for m in models.models)
    return RequestPaths(
        front.path(chat.serve),
        front.path(audio.serve, json=False),
        image_routes(
            gate,
            front.path,
            pool,
            s,
            job_submitter(jobs, job_ended),
            keep_files=images,
            count_images=count_images,
        ),
    )

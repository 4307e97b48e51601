"""ComfyUI behind the runner: OpenAI's images API on ComfyUI workflows.

Modules: `client` (ComfyUI's HTTP API and websocket), `events` (its job events and history
entries, read into values), `follow` (one prompt followed to its end), `workflows`
(templates with typed parameters), `server` (spawn or attach), `engine` (one model:
load, unload, flush, status), `images` (the generation itself), `image_costs` (a request's
cost and work), `facet` (the images facet the runner's path is typed by), `errors`. The
request, the images kept for `response_format: url` and the facet's protocols are every
image kind's (adapters/image_request.py, image_store.py, images.py); the HTTP handlers are
the runner's (runner/http/images/).
"""

from adapters.comfyui.client import ComfyUIClient
from adapters.comfyui.engine import (
    NO_KV_CACHE,
    ComfyModelState,
    ComfyUIEngine,
    LoadReport,
    UnloadReport,
)
from adapters.comfyui.follow import FollowTiming
from adapters.comfyui.images import ImageGenerator
from adapters.comfyui.server import ComfyUIServer, Memory, ServerStatus, command_line
from adapters.comfyui.template_checks import load_template, within_comfyui
from adapters.comfyui.workflows import (
    BUILTIN,
    MODEL_FREE_TEST,
    TXT2IMG,
    Param,
    WorkflowTemplate,
)

__all__ = [
    "BUILTIN",
    "MODEL_FREE_TEST",
    "NO_KV_CACHE",
    "TXT2IMG",
    "ComfyModelState",
    "ComfyUIClient",
    "ComfyUIEngine",
    "ComfyUIServer",
    "FollowTiming",
    "ImageGenerator",
    "LoadReport",
    "Memory",
    "Param",
    "ServerStatus",
    "UnloadReport",
    "WorkflowTemplate",
    "command_line",
    "load_template",
    "within_comfyui",
]

"""The bare request paths the app mounts (runner/http/app.py): those its engine kinds
declare (`Traits.request_path`), POST only, and only while the runner is ready."""

from __future__ import annotations

import httpx
import pytest

from adapters.kind import KindDefaults, Traits
from runner.engines.kinds import EngineKinds
from runner.floor.models_file import ModelsFile
from runner.floor.settings import Settings
from runner.http.app import RunnerApp, request_routes
from runner.runtime.build import build_app
from runner.telemetry.health import Life

pytestmark = pytest.mark.timeout(30)


class ChatWhisper(KindDefaults):
    """A registered kind of the speech kind's name that serves chat: no kind declares the
    audio path any more."""

    name = "faster-whisper"
    traits = Traits(request_path="chat")


def _app(kinds: EngineKinds | None = None, life: Life = Life.READY) -> RunnerApp:
    app = build_app(Settings(), ModelsFile(), kinds=kinds)
    app.rt.life = life
    return app


async def _request(app: RunnerApp, method: str, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://runner") as client:
        return await client.request(method, path)


def _code(r: httpx.Response) -> str:
    code = r.json()["error"]["code"]
    assert isinstance(code, str)
    return code


def test_app_routes_request_routes_leave_out_a_path_no_kind_declares() -> None:
    """Each declared request path's URLs map to its handler; an undeclared path's map to
    nothing."""

    async def chat(*_: object) -> None: ...

    async def audio(*_: object) -> None: ...

    paths = {"chat": (("/c1", "/c2"), chat), "audio": (("/a",), audio)}
    assert request_routes(paths, {"chat", "images"}) == {"/c1": chat, "/c2": chat}
    assert request_routes(paths, {"chat", "audio"}) == {"/c1": chat, "/c2": chat, "/a": audio}


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/audio/transcriptions", "/v1/images/generations"]
)
async def test_app_routes_request_paths_are_post_only_once_ready(path: str) -> None:
    """A GET on a request path of a ready runner is 405 with Allow: POST."""
    r = await _request(_app(), "GET", path)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert _code(r) == "method_not_allowed"


async def test_app_routes_image_path_is_503_while_starting_whatever_the_method() -> None:
    """While the runner starts, the image path answers 503 before it looks at the method
    (the chat and audio paths answer 405 first)."""
    app = _app(life=Life.STARTING)
    images = await _request(app, "GET", "/v1/images/generations")
    assert images.status_code == 503
    chat = await _request(app, "GET", "/v1/chat/completions")
    assert chat.status_code == 405


async def test_app_routes_mount_only_the_request_paths_a_kind_declares() -> None:
    """With no kind declaring the audio path, its URLs are not mounted (the control plane's
    404), while the chat path still is."""
    app = _app(EngineKinds(extra=[ChatWhisper]))
    audio = await _request(app, "GET", "/v1/audio/transcriptions")
    assert audio.status_code == 404
    chat = await _request(app, "GET", "/v1/chat/completions")
    assert chat.status_code == 405

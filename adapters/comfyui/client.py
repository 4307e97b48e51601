"""ComfyUI's HTTP API and websocket, as `server.py` serves them (facts: docs/engines.md).

    POST /prompt {prompt, client_id, prompt_id}  200 {prompt_id, number, node_errors}
                                                 400 {error, node_errors}   409 duplicate id
    GET  /history/{id}       {} until the prompt ended, then {id: entry}
    GET  /queue              {queue_running: [item], queue_pending: [item]}
                             item = [number, prompt_id, graph, extra_data, outputs]
    POST /queue {delete}     removes pending prompts (a running one is not touched)
    POST /interrupt {prompt_id}  interrupts that prompt only if it is the running one
    POST /history {delete}   forgets finished prompts
    POST /free {unload_models, free_memory}  sets flags the worker applies after the
                             current prompt; no acknowledgement (read /system_stats after)
    GET  /system_stats, /view?filename&subfolder&type, /object_info[/{class}], /models/{folder}
    GET  /ws?clientId=...    events for the prompts submitted with that client_id

The HTTP client (`httpx.AsyncClient` with ComfyUI's base URL) is injected; so is the
websocket opener. Every httpx failure is translated in `errors.translate_http`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode

import httpx
import orjson
import websockets
from websockets.asyncio.client import connect as ws_connect

from adapters.comfyui.errors import (
    DuplicatePromptId,
    WorkflowPartlyRejected,
    WorkflowRejected,
    translate_http,
)
from adapters.comfyui.events import ImageRef
from adapters.errors import EngineBadResponse, EngineError

log = logging.getLogger("quorum.comfyui")

WS_MAX_MESSAGE = 64 * 1024 * 1024  # preview frames are binary images


class Socket(Protocol):
    """What the follower needs of a websocket connection (websockets' ClientConnection)."""

    async def recv(self) -> str | bytes: ...

    async def close(self) -> None: ...


SocketOpener = Callable[[str], Awaitable[Socket]]


async def open_websocket(url: str) -> Socket:
    """websockets' client, without a proxy (ComfyUI is local) and with room for previews."""
    return await ws_connect(url, proxy=None, max_size=WS_MAX_MESSAGE, open_timeout=10)


SOCKET_ERRORS: tuple[type[BaseException], ...] = (
    websockets.exceptions.WebSocketException,
    OSError,
    TimeoutError,
)
"""What opening or reading a websocket raises when the connection is lost or refused."""


@dataclass(frozen=True, slots=True)
class Submitted:
    prompt_id: str
    number: float


@dataclass(frozen=True, slots=True)
class QueueState:
    """Prompt ids running and pending, in ComfyUI's queue order."""

    running: tuple[str, ...]
    pending: tuple[str, ...]

    @property
    def depth(self) -> int:
        return len(self.running) + len(self.pending)


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    type: str
    index: int | None
    vram_total: int
    vram_free: int
    torch_vram_total: int
    torch_vram_free: int


@dataclass(frozen=True, slots=True)
class SystemStats:
    ram_total: int
    ram_free: int
    comfyui_version: str
    devices: tuple[Device, ...]
    argv: tuple[str, ...] = ()  # ComfyUI's command line (its folders are in it)

    @property
    def primary(self) -> Device | None:
        """ComfyUI lists its torch device first."""
        return self.devices[0] if self.devices else None


def new_prompt_id() -> str:
    """A fresh prompt id in the form ComfyUI v0.38+ requires (canonical lowercase UUID)."""
    return str(uuid.uuid4())


def new_client_id() -> str:
    return uuid.uuid4().hex


class ComfyUIClient:
    """One ComfyUI server. `http` has ComfyUI's base URL; nothing is sent on construction."""

    def __init__(self, http: httpx.AsyncClient, opener: SocketOpener = open_websocket) -> None:
        self.http = http
        self._open = opener

    @property
    def base_url(self) -> str:
        return str(self.http.base_url).rstrip("/")

    def websocket_url(self, client_id: str) -> str:
        base = self.base_url
        scheme = "wss" if base.startswith("https:") else "ws"
        return f"{scheme}:{base.split(':', 1)[1]}/ws?{urlencode({'clientId': client_id})}"

    async def _call(self, method: str, path: str, what: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise translate_http(exc, what) from None

    async def _json(self, path: str, what: str) -> Any:
        response = await self._call("GET", path, what)
        if response.status_code != 200:
            raise EngineBadResponse(f"ComfyUI answered {what} with {response.status_code}")
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise EngineBadResponse(
                f"ComfyUI answered {what} with a body that is not JSON"
            ) from None

    async def _post(self, path: str, body: Mapping[str, Any], what: str) -> None:
        response = await self._call("POST", path, what, content=orjson.dumps(body))
        if response.status_code != 200:
            raise EngineBadResponse(f"ComfyUI answered {what} with {response.status_code}")

    # -- prompts ---------------------------------------------------------------------

    async def submit(
        self,
        graph: Mapping[str, Any],
        client_id: str,
        prompt_id: str | None = None,
        extra_data: Mapping[str, Any] | None = None,
    ) -> Submitted:
        """Queue `graph` under a fresh prompt id (one more on a 409 duplicate).

        A 400 raises `WorkflowRejected` with ComfyUI's node errors; a 200 whose
        `node_errors` is not empty (ComfyUI dropped the failing outputs and queued the
        rest) is removed again and raises `WorkflowPartlyRejected`.
        """
        try:
            return await self._submit_once(
                graph, client_id, prompt_id or new_prompt_id(), extra_data
            )
        except DuplicatePromptId:
            log.warning("ComfyUI already knew a fresh prompt id; sending once more")
            return await self._submit_once(graph, client_id, new_prompt_id(), extra_data)

    async def _submit_once(
        self,
        graph: Mapping[str, Any],
        client_id: str,
        prompt_id: str,
        extra_data: Mapping[str, Any] | None,
    ) -> Submitted:
        body: dict[str, Any] = {"prompt": graph, "client_id": client_id, "prompt_id": prompt_id}
        if extra_data:
            body["extra_data"] = dict(extra_data)
        response = await self._call("POST", "/prompt", "POST /prompt", content=orjson.dumps(body))
        try:
            answer = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            answer = None
        status = response.status_code
        if status == 409:
            raise DuplicatePromptId(prompt_id)
        if not isinstance(answer, dict):
            raise EngineBadResponse(f"ComfyUI answered POST /prompt with {status}, not JSON")
        node_errors = answer.get("node_errors")
        node_errors = node_errors if isinstance(node_errors, dict) else {}
        if status == 400:
            error = answer.get("error")
            if not isinstance(error, dict):  # very old servers sent a bare string
                error = {"type": "invalid_prompt", "message": str(error)}
            raise WorkflowRejected(error, node_errors)
        if status != 200:
            raise EngineBadResponse(f"ComfyUI answered POST /prompt with {status}")
        queued_id = str(answer.get("prompt_id", prompt_id))
        if node_errors:
            try:
                await self.cancel(queued_id)
            except EngineError as exc:
                log.warning("prompt %s: could not remove it after node errors: %s", queued_id, exc)
            raise WorkflowPartlyRejected(
                {
                    "type": "prompt_outputs_failed_validation",
                    "message": "some outputs failed "
                    "validation and were dropped; the prompt was removed",
                },
                node_errors,
            )
        number = answer.get("number")
        return Submitted(queued_id, float(number) if isinstance(number, int | float) else 0.0)

    async def history(self, prompt_id: str) -> dict[str, Any] | None:
        """The prompt's history entry, or None while it is pending, running or unknown."""
        data = await self._json(f"/history/{prompt_id}", "GET /history")
        if not isinstance(data, dict):
            raise EngineBadResponse("ComfyUI's /history answer is not an object")
        entry = data.get(prompt_id)
        return entry if isinstance(entry, dict) else None

    async def delete_history(self, prompt_ids: list[str]) -> None:
        await self._post("/history", {"delete": prompt_ids}, "POST /history")

    async def queue(self) -> QueueState:
        data = await self._json("/queue", "GET /queue")
        if not isinstance(data, dict):
            raise EngineBadResponse("ComfyUI's /queue answer is not an object")
        return QueueState(_ids(data.get("queue_running")), _ids(data.get("queue_pending")))

    async def interrupt(self, prompt_id: str) -> None:
        """Interrupt `prompt_id` if it is the running prompt (at its next node or step)."""
        await self._post("/interrupt", {"prompt_id": prompt_id}, "POST /interrupt")

    async def delete_pending(self, prompt_ids: list[str]) -> None:
        await self._post("/queue", {"delete": prompt_ids}, "POST /queue")

    async def cancel(self, prompt_id: str) -> None:
        """Stop `prompt_id` wherever it is: removed if pending, then interrupted if running.

        The order closes the race where it starts running between the two calls; both are
        no-ops for a prompt that is not there.
        """
        await self.delete_pending([prompt_id])
        await self.interrupt(prompt_id)

    # -- server ----------------------------------------------------------------------

    async def free(self, unload_models: bool = True, free_memory: bool = True) -> None:
        body = {"unload_models": unload_models, "free_memory": free_memory}
        await self._post("/free", body, "POST /free")

    async def system_stats(self) -> SystemStats:
        data = await self._json("/system_stats", "GET /system_stats")
        if not isinstance(data, dict):
            raise EngineBadResponse("ComfyUI's /system_stats answer is not an object")
        raw_system = data.get("system")
        system: dict[str, Any] = raw_system if isinstance(raw_system, dict) else {}
        devices = tuple(
            Device(
                str(d.get("name", "")),
                str(d.get("type", "")),
                d.get("index") if isinstance(d.get("index"), int) else None,
                _int(d.get("vram_total")),
                _int(d.get("vram_free")),
                _int(d.get("torch_vram_total")),
                _int(d.get("torch_vram_free")),
            )
            for d in data.get("devices") or ()
            if isinstance(d, dict)
        )
        argv = system.get("argv")
        return SystemStats(
            _int(system.get("ram_total")),
            _int(system.get("ram_free")),
            str(system.get("comfyui_version", "unknown")),
            devices,
            tuple(str(a) for a in argv) if isinstance(argv, list) else (),
        )

    async def view(self, image: ImageRef) -> bytes:
        """The saved image's bytes (`GET /view`)."""
        query = {"filename": image.filename, "subfolder": image.subfolder, "type": image.type}
        response = await self._call("GET", "/view", "GET /view", params=query)
        if response.status_code != 200:
            raise EngineBadResponse(
                f"ComfyUI answered GET /view for {image.filename!r} with {response.status_code}"
            )
        return response.content

    async def models(self, folder: str) -> list[str]:
        """File names ComfyUI sees in a model folder (`checkpoints`, ...); [] if unknown."""
        response = await self._call("GET", f"/models/{folder}", "GET /models")
        if response.status_code == 404:
            return []
        if response.status_code != 200:
            raise EngineBadResponse(f"ComfyUI answered GET /models with {response.status_code}")
        try:
            data = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise EngineBadResponse("ComfyUI's /models answer is not JSON") from None
        return [str(x) for x in data] if isinstance(data, list) else []

    async def open_socket(self, client_id: str) -> Socket | None:
        """The event websocket for `client_id`, or None when it cannot be opened now."""
        try:
            return await self._open(self.websocket_url(client_id))
        except SOCKET_ERRORS as exc:
            log.warning("ComfyUI websocket could not be opened: %s", exc)
            return None


def _ids(items: object) -> tuple[str, ...]:
    """Prompt ids of queue items, by queue number (ComfyUI sends its heap unsorted)."""
    if not isinstance(items, list):
        return ()
    valid = [i for i in items if isinstance(i, list) and len(i) > 1]
    valid.sort(key=lambda i: i[0] if isinstance(i[0], int | float) else 0)
    return tuple(str(i[1]) for i in valid)


def _int(value: object) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0

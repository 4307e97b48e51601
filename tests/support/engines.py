"""Helpers for runner tests on engines the runner starts: governed calls, a ComfyUI folder
whose `main.py` runs the fake, and the command lines of running engine processes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from tests.support.poll import eventually
from tests.support.runner_proc import REPO_ROOT
from tests.support.tokens import DEV_REGISTRY, dev_token

GOVERNED = {"GOVERNANCE_REGISTRY": str(DEV_REGISTRY)}
CHECKPOINT = "sd15.safetensors"

_SHIM = """\
import os
import sys

sys.path.insert(0, {repo!r})
from tests.fixtures.fake_comfyui import main

here = os.path.dirname(os.path.abspath(__file__))
main(sys.argv[1:] + ["--base-directory", here, *{extra!r}])
"""


def comfyui_root(root: Path, *fake_args: str) -> Path:
    """A COMFYUI_PATH: `main.py` runs the fake ComfyUI from this folder (its models and
    output folders are here, as ComfyUI's are next to its main.py), one checkpoint in it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "main.py").write_text(_SHIM.format(repo=str(REPO_ROOT), extra=list(fake_args)))
    checkpoints = root / "models" / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    (checkpoints / CHECKPOINT).write_bytes(b"fake weights")
    return root


def load(url: str, model: str, **fields: Any) -> httpx.Response:
    """`POST /v1/models/load` with a dev token for exactly these fields."""
    token = dev_token("model-load", model, fields)
    body = {"modelId": model, **fields, "verifiedOpToken": token}
    return httpx.post(url + "/v1/models/load", json=body, timeout=30)


def unload(url: str, model: str, **fields: Any) -> httpx.Response:
    token = dev_token("model-unload", model, fields)
    body = {"modelId": model, **fields, "verifiedOpToken": token}
    return httpx.post(url + "/v1/models/unload", json=body, timeout=120)


def flush(url: str, scope: str, **fields: Any) -> httpx.Response:
    params = {"scope": scope, **{k: v for k, v in fields.items() if k != "modelId"}}
    token = dev_token("cache-flush", fields.get("modelId"), params)
    body = {"scope": scope, **fields, "verifiedOpToken": token}
    return httpx.post(url + "/v1/cache/flush", json=body, timeout=30)


def wait_task(url: str, task_id: str, timeout: float = 60) -> dict[str, Any]:
    """The load task once it ended (completed, failed or cancelled)."""

    def ended() -> dict[str, Any] | None:
        doc: dict[str, Any] = httpx.get(f"{url}/v1/models/load/{task_id}").json()
        return doc if doc["status"] in ("completed", "failed", "cancelled") else None

    return eventually(ended, timeout, f"the end of load task {task_id}")


def load_and_wait(url: str, model: str, **fields: Any) -> dict[str, Any]:
    r = load(url, model, **fields)
    assert r.status_code == 202, r.text
    return wait_task(url, r.json()["taskId"])


def caps(url: str) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(url + "/v1/capabilities").json()
    return doc


def loaded(url: str) -> list[str]:
    return [m["id"] for m in caps(url)["models"]["loaded"]]


def processes_with(*parts: str, parent: int | None = None) -> list[tuple[int, list[str]]]:
    """(pid, argv) of every process whose argv contains each of `parts` as an argument
    (children of `parent` only, when given)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
            status = (entry / "status").read_text()
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        ppid = int(status.split("PPid:", 1)[1].split()[0])
        if all(p in args for p in parts) and parent in (None, ppid):
            found.append((int(entry.name), args))
    return found


def process_env(pid: int) -> dict[str, str]:
    raw = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
    pairs = (item.decode(errors="replace").partition("=") for item in raw if item)
    return {k: v for k, _, v in pairs}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def process_group(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (zombies not counted): an engine the
    runner started leads its own group, and what it forks (vLLM's EngineCore, Worker) joins
    it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found

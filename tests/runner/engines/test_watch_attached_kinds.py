"""The attached-engine watch on every backend that can be attached (docs/reliability.md,
section 6): each is probed on its own path (its kind's `Traits.probe_path`: llama-server and
vLLM `/health`, ComfyUI `/system_stats`; `openai` is tests/runner/engines/test_watch_attached.py).
Killed, the model reads failed and refuses with 503 and Retry-After; started again on its
port, the model serves again by itself. The engines are the fakes, run by hand."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.fixtures.fake_vllm import BIN as VLLM_BIN
from tests.fixtures.fake_vllm import process_env as vllm_env
from tests.support.engines import CHECKPOINT, caps, comfyui_root
from tests.support.groups import end_group
from tests.support.poll import eventually
from tests.support.ports import free_port
from tests.support.runner_proc import REPO_ROOT, start_runner

pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True)
class Attached:
    """One backend attached by URL: how to start its fake on a port, its models-file line,
    and a request for its model."""

    backend: str
    argv: Callable[[int, Path], list[str]]
    health: str
    entry: Callable[[str], str]
    path: str
    body: dict[str, object]
    env: Callable[[], dict[str, str]] = dict


def _python(module: str, *args: str) -> Callable[[int, Path], list[str]]:
    return lambda port, _tmp: [sys.executable, "-m", module, "--port", str(port), *args]


def _vllm_argv(port: int, _tmp: Path) -> list[str]:
    return [str(VLLM_BIN), "serve", "org/m", "--port", str(port), "--served-model-name", "m"]


def _comfyui_argv(port: int, tmp: Path) -> list[str]:
    folder = str(comfyui_root(tmp / "ComfyUI"))
    module = "tests.fixtures.fake_comfyui"
    return [sys.executable, "-m", module, "--port", str(port), "--base-directory", folder]


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
KINDS = [
    Attached(
        "llama-server",
        _python("tests.fixtures.fake_openai", "--latency-ms", "1"),
        "/health",
        lambda url: f"  - {{id: m, backend: llama-server, url: '{url}', parallel: 1}}\n",
        "/v1/chat/completions",
        {"model": "m", **CHAT},
    ),
    Attached(
        "vllm",
        _vllm_argv,
        "/health",
        lambda url: f"  - {{id: m, backend: vllm, url: '{url}', parallel: 1}}\n",
        "/v1/chat/completions",
        {"model": "m", **CHAT},
        env=lambda: vllm_env(),
    ),
    Attached(
        "comfyui",
        _comfyui_argv,
        "/system_stats",
        lambda url: f"  - {{id: m, backend: comfyui, url: '{url}', checkpoint: {CHECKPOINT}}}\n",
        "/v1/images/generations",
        {"model": "m", "prompt": "a kite", "size": "64x64"},
    ),
]


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=1)
    except httpx.TransportError:
        return False
    return True


@contextmanager
def attached_engine(kind: Attached, port: int, tmp: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`kind`'s fake started on `port` (its own session), until its health path answers;
    killed with its group at the end."""
    env = {**os.environ, **kind.env()}
    proc = subprocess.Popen(
        kind.argv(port, tmp), cwd=REPO_ROOT, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        eventually(lambda: _answers(f"http://127.0.0.1:{port}{kind.health}"), 30, kind.backend)
        yield proc
    finally:
        end_group(proc)


def _failed(url: str) -> dict[str, str]:
    return {f["id"]: f["error"] for f in caps(url)["models"]["failed"]}


@pytest.mark.parametrize("kind", KINDS, ids=[k.backend for k in KINDS])
def test_attached_kind_lost_is_503_with_retry_after_and_comes_back(
    kind: Attached, tmp_path: Path
) -> None:
    """Killed: the model reads failed (no exit code) and a request gets 503
    model_unavailable with Retry-After; the engine back on its port: served again."""
    port = free_port()
    engine_url = f"http://127.0.0.1:{port}"
    models = "models:\n" + kind.entry(engine_url)
    env = {"ENGINE_STATS_INTERVAL_S": "0.3"}
    with (
        attached_engine(kind, port, tmp_path) as proc,
        start_runner(models_file=models, env=env) as r,
    ):
        send = lambda: httpx.post(r.url + kind.path, json=kind.body, timeout=60)  # noqa: E731
        assert send().status_code == 200
        os.killpg(proc.pid, signal.SIGKILL)
        reason = eventually(lambda: _failed(r.url).get("m"), 30, "the model failed")
        assert "stopped answering" in reason
        refused = send()
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "model_unavailable"
        assert int(refused.headers["Retry-After"]) > 0
        with attached_engine(kind, port, tmp_path):
            eventually(lambda: "m" not in _failed(r.url) and send().status_code == 200, 45, "back")

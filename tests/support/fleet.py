"""Real runner processes in the states the client's and the status page's tests need.

Every runner is `python -m runner` (tests/support/runner_proc.py) with a models file whose
engine is one of the stand-in llama-servers of tests/fixtures/bin/, started and supervised
by the runner itself, so loads, queues and refusals are the runner's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, fixture_bin, start_runner
from tests.support.tokens import DEV_REGISTRY, dev_token


def entry(model: str, binary: str, *, preload: bool = False, restart: bool = False) -> str:
    """One model of a models file, served by the stand-in engine `binary`, one slot."""
    return (
        f"  - id: {model}\n"
        "    backend: llama-server\n"
        "    path: /dev/null\n"
        f"    bin: {fixture_bin(binary)}\n"
        "    vram_mb: 64\n"
        "    parallel: 1\n"
        f"    preload: {str(preload).lower()}\n"
        f"    restart: {str(restart).lower()}\n"
    )


@dataclass(frozen=True)
class Model:
    """A model of a test runner: its stand-in engine, preloaded or not, restarted or not."""

    binary: str
    preload: bool = False
    restart: bool = False


@contextmanager
def runner(
    runner_id: str,
    binary: str = "",
    *,
    preload: bool = False,
    env: dict[str, str] | None = None,
    models: dict[str, Model] | None = None,
) -> Iterator[RunnerProcess]:
    """A runner named `runner_id` serving model `m` with the stand-in engine `binary`
    (or `models`); returns once the preloaded models are loaded."""
    models = models or {"m": Model(binary, preload)}
    text = "models:\n" + "".join(
        entry(m, x.binary, preload=x.preload, restart=x.restart) for m, x in models.items()
    )
    full_env = {"GOVERNANCE_REGISTRY": str(DEV_REGISTRY), "RUNNER_ID": runner_id, **(env or {})}
    with start_runner(models_file=text, env=full_env) as r:
        for model, spec in models.items():
            if spec.preload:
                eventually(lambda m=model: m in loaded(r), timeout=30)
        yield r


def caps(r: RunnerProcess) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(r.url + "/v1/capabilities", timeout=5).json()
    return doc


def loaded(r: RunnerProcess) -> list[str]:
    return [m["id"] for m in caps(r)["models"]["loaded"]]


def loading(r: RunnerProcess) -> list[str]:
    return [m["id"] for m in caps(r)["models"]["loading"]]


def load_token(runner_id: str, model: str = "m", **params: object) -> dict[str, Any]:
    """A 2-of-3 model-load token for `model` on `runner_id` (development keys)."""
    return dev_token("model-load", model, params, aud=runner_id)


@contextmanager
def full_queue(
    r: RunnerProcess,
    waiting: int,
    *,
    model: str = "m",
    headers: dict[str, str] | None = None,
    prompt: str = "hi",
    holder: dict[str, str] | None = None,
) -> Iterator[list[Future[httpx.Response]]]:
    """Hold `model`'s only slot with a long stream and queue `waiting` requests (with
    `headers`, asking `prompt`) behind it, until the block ends (then the stream hangs up
    and the queued requests are served); `holder`: the headers of the holding stream."""
    chat = {"model": model, "messages": [{"role": "user", "content": prompt}]}
    body = {**chat, "stream": True}
    with ExitStack() as stack:
        client = stack.enter_context(httpx.Client(timeout=60))
        pool = stack.enter_context(ThreadPoolExecutor(waiting))
        stream = stack.enter_context(
            client.stream("POST", r.url + "/v1/chat/completions", json=body, headers=holder or {})
        )
        assert stream.status_code == 200
        chunks = stream.iter_raw()  # keep a reference: dropping it would hang up at once
        next(chunks)
        queued = [
            pool.submit(
                httpx.post,
                r.url + "/v1/chat/completions",
                json=chat,
                headers=headers or {},
                timeout=60,
            )
            for _ in range(waiting)
        ]
        eventually(lambda: caps(r)["queue"]["depth"] == waiting)
        yield queued

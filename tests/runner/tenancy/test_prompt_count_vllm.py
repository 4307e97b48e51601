"""vLLM's count of a prompt (adapters/vllm/prompt_tokens.py: `POST /tokenize`) equals the
`prompt_tokens` of its own answer to the same request: on the fake vLLM (attached by URL)
and on the real vLLM CPU build the runner starts (its Unix socket), chats (the model's
chat template) and completions alike."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import httpx
import pytest

from adapters.engine_urls import unix_url
from adapters.http_client import EngineConnections
from adapters.vllm.prompt_tokens import VllmPromptCounter
from tests.fixtures.fake_vllm import BIN
from tests.runner.tenancy.test_prompt_count import BODIES, IMAGE
from tests.support.engine_counters import _argv, _descendants, _value
from tests.support.groups import end_group
from tests.support.poll import eventually
from tests.support.ports import free_port
from tests.support.real_vllm import DEFAULT_ID, START_TIMEOUT_S, default_entry, models_file
from tests.support.runner_proc import start_runner

pytestmark = pytest.mark.timeout(600)


async def check_exact(engine_url: str, model: str, send: httpx.AsyncClient) -> None:
    """Each body's count on `engine_url` equals the `prompt_tokens` of its answer through
    `send` (the engine itself, or a runner in front of it)."""
    http = EngineConnections(engine_url, 5.0, 120.0)
    counter = VllmPromptCounter(http, timeout_s=60.0)
    try:
        for path, body in BODIES:
            request = {**body, "model": model}
            counted = await counter.count_prompt(path, request)
            answer = await send.post(path, json={**request, "max_tokens": 1, "temperature": 0})
            assert answer.status_code == 200, answer.text
            assert counted == answer.json()["usage"]["prompt_tokens"], (path, body)
        with_image = {"model": model, "messages": [{"role": "user", "content": [IMAGE]}]}
        assert await counter.count_prompt("/v1/chat/completions", with_image) is None
    finally:
        http.close()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


async def test_prompt_count_fake_vllm_is_exact() -> None:
    """The fake vLLM's `/tokenize` count is its answer's `prompt_tokens`."""
    port = free_port()
    argv = [str(BIN), "serve", "org/a", "--port", str(port), "--served-model-name", "a"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        eventually(lambda: _healthy(url), timeout=30)
        async with httpx.AsyncClient(base_url=url, timeout=60) as engine:
            await check_exact(url, "a", engine)
    finally:
        end_group(proc)


@pytest.fixture
def vllm_runner(real_vllm: None) -> Iterator[tuple[str, str]]:
    """A runner serving the real vLLM (the default models file's entry), and the URL of
    the engine's own socket."""
    entry = default_entry(preload=True, parallel=1)
    with start_runner(models_file=models_file(entry), ready_timeout=START_TIMEOUT_S) as r:
        for pid in _descendants(r.proc.pid):
            argv = _argv(pid)
            if "--uds" in argv:
                yield r.url, unix_url(_value(argv, "--uds"))
                return
        raise AssertionError("no vLLM on a Unix socket under the runner")


async def test_prompt_count_real_vllm_is_exact(vllm_runner: tuple[str, str]) -> None:
    """The real vLLM's count (its chat template applied, as its chat endpoint does) is
    the `prompt_tokens` of its answer, through the runner."""
    runner_url, engine_url = vllm_runner
    async with httpx.AsyncClient(base_url=runner_url, timeout=300) as runner:
        await check_exact(engine_url, DEFAULT_ID, runner)

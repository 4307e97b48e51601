"""A prompt counted as its engine counts it (adapters/prompt_tokens.py): llama-server's
count (`/apply-template`, then `/tokenize`) equals the `prompt_tokens` of its own answer
to the same request, on the real llama-server (two models, two chat templates) and on the
fake; through a runner, a request that fits its token budget with the byte bound is never
counted, and one whose byte bound exceeds the budget is counted and served on the count
(a kind that cannot count, `openai`, keeps the byte bound), on the fake and on the real
llama-server the runner starts (its API key on the counting calls too)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.http_client import EngineConnections
from adapters.llama_server.prompt_tokens import LlamaPromptCounter
from tests.fixtures.launch import start_fake
from tests.support.groups import end_group
from tests.support.ports import free_port
from tests.support.real_engines import LlamaServer
from tests.support.runner_proc import start_runner

pytestmark = pytest.mark.timeout(180)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
TURNS = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And «3+3», in words? 🙂 <|im_end|> <start_of_turn>"},
]
PARTS = [{"type": "text", "text": "two parts:"}, {"type": "text", "text": " one, two"}]
BODIES: list[tuple[str, dict[str, Any]]] = [
    (CHAT, {"messages": [{"role": "user", "content": "tell me one short thing about the sea"}]}),
    (CHAT, {"messages": TURNS}),
    (CHAT, {"messages": [{"role": "user", "content": PARTS}]}),
    (COMPLETIONS, {"prompt": "Once upon a time, in a   small town,"}),
    (COMPLETIONS, {"prompt": "<bos>hello there"}),
]
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


async def check_exact(url: str) -> None:
    """Each body's count equals the `prompt_tokens` of the engine's answer to it."""
    http = EngineConnections(url, 5.0, 60.0)
    counter = LlamaPromptCounter(http, timeout_s=30.0)
    try:
        await compare(counter, url)
    finally:
        http.close()


async def compare(counter: LlamaPromptCounter, url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for path, body in BODIES:
            counted = await counter.count_prompt(path, body)
            answer = await client.post(path, json={**body, "max_tokens": 1, "temperature": 0})
            assert answer.status_code == 200, answer.text
            assert counted == answer.json()["usage"]["prompt_tokens"], (path, body)
        with_image = {"messages": [{"role": "user", "content": [IMAGE]}]}
        assert await counter.count_prompt(CHAT, with_image) is None
        assert await counter.count_prompt(COMPLETIONS, {"prompt": ["a", "b"]}) is None


async def test_prompt_count_fake_llama_is_exact() -> None:
    """The fake's count is its answer's `prompt_tokens`, for chats and completions."""
    with start_fake("fake_openai", "--latency-ms", "1") as engine:
        await check_exact(engine.url)


@pytest.fixture(params=["gemma", "smollm2"])
def hand_started(request: pytest.FixtureRequest, real_llama_server: LlamaServer) -> Iterator[str]:
    """The real llama-server on one of the two GGUFs, started by hand (no API key)."""
    gguf: Path = getattr(real_llama_server, request.param)
    port = free_port()
    argv = [real_llama_server.bin, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        [*argv, "-c", "2048", "--parallel", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        yield url
    finally:
        end_group(proc)


async def test_prompt_count_real_llama_is_exact(hand_started: str) -> None:
    """The real llama-server's count (its template applied, then tokenized with its
    special tokens) is its answer's `prompt_tokens`, on two models' templates."""
    await check_exact(hand_started)


BUDGET_TENANTS = """
tenants:
  small:
    token_budgets: [{tokens: 200, per: minute}]
  large:
    token_budgets: [{tokens: 1000000, per: minute}]
"""
BODY = {
    "model": "echo",
    "messages": [{"role": "user", "content": "tell me one short thing about the sea"}],
    "max_tokens": 100,
}  # the byte bound: about 130 bytes + 80 template tokens + 100 > 200; counted: 8 + 100


@pytest.fixture
def fake_engine() -> Iterator[Any]:
    with start_fake("fake_openai", "--latency-ms", "1") as engine:
        yield engine


def runner_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "tenants.yaml").write_text(BUDGET_TENANTS)
    return {"TENANTS_FILE": str(tmp_path / "tenants.yaml")}


def models(url: str, backend: str) -> str:
    return f"models:\n  - id: echo\n    backend: {backend}\n    url: {url}\n    parallel: 4\n"


def test_prompt_count_an_ordinary_request_is_never_counted(
    fake_engine: Any, tmp_path: Path
) -> None:
    """A request that fits its budget with the byte bound: served, its prompt never
    counted (no `/apply-template`, no `/tokenize` reaches the engine)."""
    llama = models(fake_engine.url, "llama-server")
    with start_runner(models_file=llama, env=runner_env(tmp_path)) as r:
        for _ in range(3):
            answer = httpx.post(r.url + CHAT, json=BODY, headers={"X-Tenant-ID": "large"})
            assert answer.status_code == 200, answer.text
    assert fake_engine.received("/apply-template") == 0
    assert fake_engine.received("/tokenize") == 0


def test_prompt_count_a_bound_too_large_is_served_on_the_count(
    fake_engine: Any, tmp_path: Path
) -> None:
    """The byte bound above the whole 200-token budget: the prompt is counted once (8)
    and the request served with 8 + 100 reserved; on a kind that cannot count (`openai`)
    it stays 400 `request_exceeds_budget`."""
    llama = models(fake_engine.url, "llama-server")
    with start_runner(models_file=llama, env=runner_env(tmp_path)) as r:
        answer = httpx.post(r.url + CHAT, json=BODY, headers={"X-Tenant-ID": "small"})
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-ratelimit-remaining-tokens"] == str(200 - 8 - 100)
    assert fake_engine.received("/apply-template") == 1
    assert fake_engine.received("/tokenize") == 1
    openai = models(fake_engine.url, "openai")
    with start_runner(models_file=openai, env=runner_env(tmp_path)) as r:
        answer = httpx.post(r.url + CHAT, json=BODY, headers={"X-Tenant-ID": "small"})
        assert answer.status_code == 400 and "request_exceeds_budget" in answer.text


def test_prompt_count_real_llama_through_the_runner(
    real_llama_server: LlamaServer, tmp_path: Path
) -> None:
    """The llama-server a runner starts (its API key on every call): a request whose byte
    bound exceeds the 200-token budget is counted and served, reserving exactly its
    prompt (as the engine reported it) plus `max_tokens`."""
    gguf = real_llama_server.gemma
    models = (
        f"models:\n  - {{id: gemma, backend: llama-server, path: '{gguf}', context_length: 1024,"
        " parallel: 1, preload: true}\n"
    )
    with start_runner(models_file=models, env=runner_env(tmp_path), ready_timeout=120) as r:
        body = {**BODY, "model": "gemma", "max_tokens": 20, "temperature": 0}
        answer = httpx.post(r.url + CHAT, json=body, headers={"X-Tenant-ID": "small"}, timeout=120)
        assert answer.status_code == 200, answer.text
        prompt = answer.json()["usage"]["prompt_tokens"]
        assert answer.headers["x-ratelimit-remaining-tokens"] == str(200 - prompt - 20)

"""One envelope for every error: the engines' own refusals (real llama-server, the vLLM fake,
the OpenAI-compatible fake) reach the client as the runner's envelope with a string code,
and token limits the runner can check are refused before an engine sees them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fixtures.fake_vllm import BIN as VLLM_BIN
from tests.fixtures.fake_vllm import process_env
from tests.fixtures.launch import start_fake
from tests.support.real_engines import LlamaServer
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(180)

LONG = " ".join(f"word{i}" for i in range(400))


def _post(runner: RunnerProcess, model: str, **body: Any) -> httpx.Response:
    if "messages" not in body and "prompt" not in body:
        body["messages"] = [{"role": "user", "content": "hi"}]
    return httpx.post(
        runner.url + "/v1/chat/completions",
        json={"model": model, **body},
        headers={"X-Tenant-ID": "acme"},
        timeout=120,
    )


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    assert isinstance(error["code"], str) and isinstance(error["type"], str), error
    return error


@pytest.fixture(scope="module")
def runner(real_llama_server: LlamaServer) -> Iterator[RunnerProcess]:
    llama = real_llama_server
    models = (
        "models:\n"
        f"  - {{id: gemma, backend: llama-server, path: '{llama.gemma}', context_length: 256,"
        f" parallel: 1, preload: true, bin: '{llama.bin}'}}\n"
        f"  - {{id: v, backend: vllm, hf: org/v, context_length: 64, parallel: 1,"
        f" preload: true, bin: '{VLLM_BIN}'}}\n"
    )
    env = {**process_env(), "RUNNER_MEMORY_MB": "81920", "VLLM_GPU_MEMORY_UTILIZATION": "0.3"}
    with start_runner(models_file=models, env=env, ready_timeout=120) as r:
        yield r


def test_llama_prompt_over_context_is_runner_envelope(runner: RunnerProcess) -> None:
    """A prompt over llama-server's context is 400 context_length_exceeded (string code)."""
    error = _error(_post(runner, "gemma", messages=[{"role": "user", "content": LONG}]), 400)
    assert error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert "context" in error["message"] and error["contextLength"] > 0


def test_llama_huge_max_tokens_is_refused_by_the_runner(runner: RunnerProcess) -> None:
    """max_tokens 10^12 is 400 invalid_request from the runner, naming the field and the
    context, never the engine's overflowed number."""
    refusals_before = runner.log().count("engine for gemma answered")
    error = _error(_post(runner, "gemma", max_tokens=10**12), 400)
    assert error["code"] == "invalid_request" and error["param"] == "max_tokens"
    assert "256 (the model's context length)" in error["message"]
    assert "-727379968" not in error["message"]
    assert runner.log().count("engine for gemma answered") == refusals_before  # never sent


def test_llama_answer_still_passes(runner: RunnerProcess) -> None:
    """A request within every range is served as before."""
    r = _post(runner, "gemma", max_tokens=2, temperature=0)
    assert r.status_code == 200, r.text


def test_vllm_refusals_are_runner_envelope(runner: RunnerProcess) -> None:
    """The vLLM fake's own refusals (context, a validator naming its parameter) are the
    runner's envelope, the engine's message kept on one line."""
    error = _error(_post(runner, "v", messages=[{"role": "user", "content": LONG}]), 400)
    assert error["code"] == "context_length_exceeded" and "\n" not in error["message"]
    error = _error(_post(runner, "v", stream_options={"include_usage": True}), 400)
    assert error["code"] == "invalid_request" and error["param"] == "stream_options"
    assert "Stream options" in error["message"]


def test_openai_fake_refusal_is_runner_envelope() -> None:
    """An OpenAI-compatible engine's 400 with an integer code is the runner's envelope."""
    with start_fake("fake_openai") as engine, start_runner({"echo": engine.url}) as runner:
        r = httpx.post(runner.url + "/v1/completions", json={"model": "echo"}, timeout=20)
        error = _error(r, 400)
        assert error["code"] == "invalid_request" and "x-request-id" in r.headers

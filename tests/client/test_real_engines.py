"""The pool's inference helpers on the real engines: llama-server with Gemma 3 270M (chat,
completions, embeddings) and faster-whisper tiny.en (transcriptions), each started and
supervised by a real runner process."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

from client import AsyncRunnerPool, RunnerPool
from tests.support.fleet import loaded
from tests.support.poll import eventually
from tests.support.real_engines import LlamaServer
from tests.support.runner_proc import start_runner

pytestmark = pytest.mark.timeout(180)


def test_helpers_on_real_llama_server_and_whisper(
    real_llama_server: LlamaServer, whisper_model: str, tmp_path: Path
) -> None:
    """chat, completions and embeddings reach Gemma, transcriptions reach tiny.en; every
    answer carries the runner's X-* headers; the async pool answers the same way."""
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng not installed: run scripts/install-system")
    speech = tmp_path / "hello.wav"
    subprocess.run(["espeak-ng", "-s", "120", "-w", str(speech), "hello world"], check=True)
    models = (
        "models:\n"
        f"  - {{id: gemma, backend: llama-server, path: {real_llama_server.gemma},"
        " context_length: 512, parallel: 1, preload: true, embeddings: true, pooling: mean}\n"
        f"  - {{id: whisper, backend: faster-whisper, path: {whisper_model}, preload: true}}\n"
    )
    env = {"RUNNER_ID": "real", "WHISPER_CPU_THREADS": "1"}
    with (
        start_runner(models_file=models, env=env, ready_timeout=120) as r,
        RunnerPool([r.url], tenant="acme") as pool,
    ):
        eventually(lambda: {"gemma", "whisper"} <= set(loaded(r)), timeout=90)
        chat = pool.chat("gemma", [{"role": "user", "content": "Name a colour."}], max_tokens=8)
        assert chat.json()["choices"][0]["message"]["content"]
        assert chat.headers["x-cache-hit"] in ("true", "false") and "x-gpu-time-ms" in chat.headers
        text = pool.completions("gemma", "The capital of France is", max_tokens=4)
        assert text.json()["usage"]["completion_tokens"] > 0
        vectors = pool.embeddings("gemma", ["one", "two"]).json()["data"]
        assert len(vectors) == 2 and len(vectors[0]["embedding"]) > 100
        heard = pool.transcriptions("whisper", speech.read_bytes(), filename="hello.wav")
        assert "world" in heard.json()["text"].lower()
        assert heard.headers["x-queue-wait-ms"].isdigit()

        async def asynchronously() -> str:
            async with AsyncRunnerPool([r.url], tenant="acme") as apool:
                answer = await apool.completions("gemma", "One, two,", max_tokens=3)
                assert answer.url == r.url
                return str(answer.json()["choices"][0]["text"])

        assert asyncio.run(asynchronously()) is not None

"""The runner with the real llama-server and the real Gemma 3 270M GGUF (scripts/install;
Gemma, not the default SmolLM2: the cache tests need its longer tokenization of the
tenants' system prompts, and nothing here reads an answer's words).

One runner per module (two slots, multi-tenant) serves the chat, embeddings and prefix
cache tests; the crash and attached-by-URL tests start their own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.llama_server.engine import LLAMA_SERVER_VERSION
from tests.fixtures.launch import start_fake
from tests.support.groups import end_group
from tests.support.ports import free_port
from tests.support.real_engines import LlamaServer
from tests.support.runner_proc import RunnerProcess, start_runner, wait_started
from tests.support.tokens import DEV_REGISTRY, dev_token

pytestmark = pytest.mark.timeout(180)

MODEL = "gemma"
SECRET_A = "You are the private assistant of tenant A. The vault code is 7741. " * 6


def _models(gguf: Path, extra: str = "", parallel: int = 2) -> str:
    return (
        "models:\n"
        f"  - id: {MODEL}\n"
        "    backend: llama-server\n"
        f"    path: {gguf}\n"
        "    context_length: 1024\n"
        f"    parallel: {parallel}\n"
        "    preload: true\n"
        "    embeddings: true\n"
        "    pooling: mean\n" + extra
    )


@pytest.fixture(scope="module")
def runner(real_llama_server: LlamaServer) -> Iterator[RunnerProcess]:
    env = {"GOVERNANCE_REGISTRY": str(DEV_REGISTRY)}
    models = _models(real_llama_server.gemma)
    with start_runner(models_file=models, env=env, ready_timeout=120) as r:
        yield r


def _chat(
    url: str, content: str, tenant: str, tag: str | None = None, system: str = SECRET_A, **kw: Any
) -> httpx.Response:
    headers = {"X-Tenant-ID": tenant}
    if tag:
        headers["X-Cache-Tag"] = tag
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": content}],
        "max_tokens": 2,
        "temperature": 0,
        **kw,
    }
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=120)


def _stream_headers(
    url: str, content: str, tenant: str, tag: str | None = None, **kw: Any
) -> httpx.Headers:
    headers = {"X-Tenant-ID": tenant}
    if tag:
        headers["X-Cache-Tag"] = tag
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": 2,
        "messages": [{"role": "system", "content": SECRET_A}, {"role": "user", "content": content}],
        **kw,
    }
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=120
    ) as r:
        assert r.status_code == 200
        text = b"".join(r.iter_bytes())
    assert b"[DONE]" in text
    assert b"prompt_progress" not in text  # the runner asked for it; the client did not
    assert f'"model":"{MODEL}"'.encode() in text and b".gguf" not in text
    return r.headers


def _hit(r: httpx.Response | httpx.Headers) -> tuple[bool, int]:
    h = r.headers if isinstance(r, httpx.Response) else r
    return h["x-cache-hit"] == "true", int(h["x-cache-tokens-reused"])


def _flush(url: str, body: dict[str, Any]) -> dict[str, Any]:
    params = {k: v for k, v in body.items() if k != "modelId"}
    token = dev_token("cache-flush", body.get("modelId"), params)
    r = httpx.post(url + "/v1/cache/flush", json={**body, "verifiedOpToken": token}, timeout=30)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


def test_llama_chat_json_and_stream(runner: RunnerProcess) -> None:
    """A real chat completion answers through the runner, whole and streamed, naming the
    model the client asked for (the engine's --alias), never the GGUF's path."""
    r = _chat(runner.url, "Say hello.", "t-chat")
    assert r.status_code == 200
    body = r.json()
    assert body["model"] == MODEL
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] >= 1
    assert int(r.headers["x-gpu-time-ms"]) > 0
    _stream_headers(runner.url, "Say hello.", "t-chat")


def test_llama_embeddings(runner: RunnerProcess) -> None:
    """Embeddings come from the real engine (started with --embeddings)."""
    r = httpx.post(
        runner.url + "/v1/embeddings",
        json={"model": MODEL, "input": "hello world"},
        headers={"X-Tenant-ID": "t-emb"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    vector = r.json()["data"][0]["embedding"]
    assert len(vector) > 16 and any(v != 0 for v in vector)


def test_llama_n_above_one_refused(runner: RunnerProcess) -> None:
    """n > 1 would take arbitrary slots: refused with 400."""
    r = _chat(runner.url, "hi", "t-n", n=2)
    assert r.status_code == 400
    assert "n > 1" in r.json()["error"]["message"]


def test_llama_same_tenant_hits_json_stream_then_tag_flush_misses(runner: RunnerProcess) -> None:
    """Same prompt, tenant and tag: hit (headers of JSON and streamed answers); a tag flush
    makes it miss."""
    first = _chat(runner.url, "Question one?", "tenant-a", "sess-1")
    assert first.status_code == 200
    hit, reused = _hit(_chat(runner.url, "Question one?", "tenant-a", "sess-1"))
    assert hit and reused > 0
    hit, reused = _hit(_stream_headers(runner.url, "Question one?", "tenant-a", "sess-1"))
    assert hit and reused > 0
    result = _flush(runner.url, {"scope": "tag", "tag": "sess-1", "modelId": MODEL})
    assert result["flushed"] is True and result["entriesRemoved"] >= 1
    hit, reused = _hit(_chat(runner.url, "Question one?", "tenant-a", "sess-1"))
    assert (hit, reused) == (False, 0)


def test_llama_stream_asking_no_progress_still_reports_the_hit(runner: RunnerProcess) -> None:
    """A client's own `"return_progress": false` does not hide the cache report: the runner's
    `true` replaces it (a duplicate key would let the engine take the client's), and the
    progress events stay out of the client's stream."""
    assert _chat(runner.url, "Question two?", "tenant-p", "sess-p").status_code == 200
    headers = _stream_headers(
        runner.url, "Question two?", "tenant-p", "sess-p", return_progress=False
    )
    hit, reused = _hit(headers)
    assert hit and reused > 0


def test_llama_other_tenant_never_hits_a_tenants_prompt(runner: RunnerProcess) -> None:
    """Tenant B sending A's exact prompt never reports a hit: on an empty slot, after A's
    slot went idle, and when B lands on A's former slot."""
    assert _chat(runner.url, "What is the code?", "iso-a").status_code == 200
    for _ in range(2):
        assert _hit(_chat(runner.url, "What is the code?", "iso-a"))[0]  # A's own slot: hit
    _wait_slots_idle(runner.proc.pid)  # A's slot idle: the engine says so, not a sleep
    b = _chat(runner.url, "What is the code?", "iso-b")
    assert _hit(b) == (False, 0)
    # Both slots now hold A and B. C takes the least recently used one: A's, erased first.
    c = _chat(runner.url, "What is the code?", "iso-c")
    assert _hit(c) == (False, 0)
    # B again: its own slot (B's prompt) may hit for B itself, but A's slot is gone for all.
    d = _chat(runner.url, "What is the code?", "iso-d")
    assert _hit(d) == (False, 0)


def test_llama_capabilities_report_engine_and_memory(runner: RunnerProcess) -> None:
    """The loaded model shows its measured memory and the engine's KV figures."""
    caps = httpx.get(runner.url + "/v1/capabilities").json()
    loaded = {m["id"]: m for m in caps["models"]["loaded"]}
    assert loaded[MODEL]["gpuMemoryMB"] > 0
    assert caps["runnerType"] == f"llama-server-{LLAMA_SERVER_VERSION}"
    assert caps["capabilities"]["streaming"] and caps["capabilities"]["prefixCaching"]
    assert not caps["capabilities"]["functionCalling"]  # no --jinja: the engine's truth
    assert caps["resources"]["kvCacheSizeMB"] > 0  # measured beyond the weights
    assert caps["resources"]["gpuMemoryUsedMB"] >= loaded[MODEL]["gpuMemoryMB"]


@pytest.fixture
def hand_started_llama(real_llama_server: LlamaServer) -> Iterator[str]:
    """llama-server started by hand with its defaults (shared RAM cache, similarity slots)."""
    llama = real_llama_server
    port = free_port()
    argv = [llama.bin, "-m", str(llama.gemma), "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        [*argv, "-c", "4096"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
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


def _attached(url: str, extra: str = "") -> str:
    return f"models:\n  - id: {MODEL}\n    backend: llama-server\n    url: {url}\n" + extra


@pytest.mark.parametrize("shared", [False, True])
def test_llama_attached_by_url_isolated_unless_shared_cache(
    hand_started_llama: str, shared: bool
) -> None:
    """A default llama-server attached by URL leaks A's prompt to B only with shared_cache."""
    extra = "    shared_cache: true\n" if shared else ""
    with start_runner(models_file=_attached(hand_started_llama, extra), ready_timeout=60) as r:
        for _ in range(3):
            assert _chat(r.url, "What is the code?", "url-a").status_code == 200
        b = _chat(r.url, "What is the code?", "url-b")
        assert b.status_code == 200
        hit, reused = _hit(b)
        if shared:
            assert hit and reused > 0  # the leak the runner closes by default
        else:
            assert (hit, reused) == (False, 0)


@pytest.mark.parametrize("restart", [False, True])
def test_llama_kill_9_midstream(real_llama_server: LlamaServer, restart: bool) -> None:
    """kill -9 of the real engine mid-stream: the client gets an error event naming the
    crash, the model reads failed with its exit code, /health and the other model answer.
    Restart off: the queued request gets 503 model_unavailable naming the signal.
    Restart on: the model comes back and the queued request is served by the restarted
    engine."""
    with start_fake("fake_openai", "--latency-ms", "1") as other:
        extra = f"    restart: {str(restart).lower()}\n"
        extra += f"  - id: echo\n    backend: openai\n    url: {other.url}\n"
        with start_runner(
            models_file=_models(real_llama_server.gemma, extra, parallel=1),
            ready_timeout=120,
            wait_ready=False,
        ) as r:
            wait_started(r, 120)
            pid = _engine_pid(r.proc.pid)
            body = {
                "model": MODEL,
                "stream": True,
                "max_tokens": 400,
                "messages": [{"role": "user", "content": "Count slowly to two hundred."}],
            }
            with (
                ThreadPoolExecutor(1) as pool,
                httpx.stream("POST", r.url + "/v1/chat/completions", json=body, timeout=120) as s,
            ):
                it = s.iter_bytes()
                next(it)  # the answer has started; the engine's one slot is taken
                queued = pool.submit(_chat, r.url, "hi", "t-queued")
                while httpx.get(r.url + "/health").json()["queueDepth"] < 1:
                    time.sleep(0.02)
                os.kill(pid, signal.SIGKILL)
                rest = b"".join(it)
                if not restart:
                    caps = httpx.get(r.url + "/v1/capabilities").json()
                    failed = {f["id"]: f for f in caps["models"]["failed"]}
                    assert failed[MODEL]["exitCode"] == -9
                    assert "SIGKILL" in failed[MODEL]["error"]
                answer = queued.result(120)
            assert b"engine_crashed" in rest and b"SIGKILL" in rest
            assert httpx.get(r.url + "/health").status_code == 200
            echo = httpx.post(
                r.url + "/v1/chat/completions",
                json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert echo.status_code == 200
            if restart:
                assert answer.status_code == 200  # served by the restarted engine
                assert _chat(r.url, "hi", "t").status_code == 200
            else:  # queued, not in flight: 503 with the reason, and when to retry
                assert answer.status_code == 503
                assert answer.json()["error"]["code"] == "model_unavailable"
                assert "SIGKILL" in answer.json()["error"]["reason"]
                assert int(answer.headers["Retry-After"]) > 0


def _wait_slots_idle(runner_pid: int, timeout: float = 30.0) -> None:
    """Wait (bounded) until the runner's llama-server reports no slot processing (`/slots`)."""
    argv = Path(f"/proc/{_engine_pid(runner_pid)}/cmdline").read_bytes().decode().split("\0")
    url = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}/slots"
    key = Path(argv[argv.index("--api-key-file") + 1]).read_text().strip()  # the runner's
    headers = {"Authorization": f"Bearer {key}"}
    deadline = time.monotonic() + timeout
    slots: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        slots = httpx.get(url, headers=headers, timeout=5).json()
        if slots and not any(slot["is_processing"] for slot in slots):
            return
        time.sleep(0.02)
    raise AssertionError(f"the engine's slots stayed busy for {timeout} s: {slots}")


def _engine_pid(runner_pid: int) -> int:
    """The llama-server child of this runner process."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        if ppid == runner_pid and cmd and cmd[0].endswith(b"llama-server"):
            return int(entry.name)
    raise AssertionError("no engine process found")


def test_llama_tenant_cache_survives_other_tenants_taking_every_slot(
    runner: RunnerProcess,
) -> None:
    """A tenant's slot taken by another tenant is saved first (in the engine's private
    directory) and restored when that tenant returns: a hit for it, never for the others."""
    system_a = "Tenant A's own private instructions follow in detail. " * 8
    system_b = "Tenant B is a completely different customer with rules. " * 8
    system_c = "Tenant C writes about the sea and ships and harbours. " * 8
    assert _chat(runner.url, "one", "keep-a", system=system_a).status_code == 200
    assert _hit(_chat(runner.url, "two", "keep-b", system=system_b)) == (False, 0)
    assert _hit(_chat(runner.url, "three", "keep-c", system=system_c)) == (False, 0)
    # Both slots now hold B and C; A's prompt was saved when C took its slot.
    hit, reused = _hit(_chat(runner.url, "four", "keep-a", system=system_a))
    assert hit and reused > 0
    # C's cache was saved when A came back; another tenant with C's prompt never gets it.
    assert _hit(_chat(runner.url, "three", "keep-d", system=system_c)) == (False, 0)

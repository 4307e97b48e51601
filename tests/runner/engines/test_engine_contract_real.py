"""One engine contract, run against the real engines: llama-server (scripts/install) and
vLLM's CPU build (scripts/install-vllm), both serving Gemma 3 270M (not the default
SmolLM2 on llama-server: the same model on both, and vLLM serves Gemma).

The same tests, for both: chat and completions whole and streamed; the cache report from
the engine's own figures; tenants never reuse each other's prompts; a tag flush, a tenant
flush and a flush of everything; a governed unload freeing the engine's measured memory and
a governed load measuring it again; SIGKILL of the engine mid-stream. One runner per engine
kind (module scope, the model preloaded); the tests run in file order and the last ones
stop and kill the engine.

Where the engines differ, a `Kind` says how, and why (docs/engines.md):
- llama-server reports the cache in the first chunk of a stream, so a streamed answer's
  headers carry it; vLLM reports it only in the stream's usage chunk (the headers say
  `false`/0), so the stream is read for that chunk.
- vLLM caches whole blocks (128 tokens on the CPU): a reused prefix is a multiple of that.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import real_engines
from tests.support.engines import flush, load, process_group, processes_with, unload, wait_task
from tests.support.poll import eventually
from tests.support.real_vllm import (
    DEFAULT_ID,
    START_TIMEOUT_S,
    default_entry,
    models_file,
    require_vllm,
)
from tests.support.runner_proc import RunnerProcess, start_runner
from tests.support.tokens import DEV_REGISTRY

pytestmark = pytest.mark.timeout(600)

# ~700 tokens: several of vLLM's 128-token blocks, so a repeat reuses most of it.
PREAMBLE = "You are the assistant of one tenant. Keep the account details private. " * 50


@dataclass(frozen=True)
class Kind:
    """One real engine kind behind the runner (`real_engine`: its tests are marked so)."""

    name: str
    model: str
    headers_report_streams: bool  # a stream's headers carry the engine's cache figure
    block: int  # the unit the engine reuses prompts in (tokens)
    real_engine: bool = True
    real_vllm: bool = False  # the vLLM group's (tests/support/real_engines.py)

    def models_file(self) -> str:
        if self.name == "vllm":  # the default models file's entry, as scripts/run serves it
            require_vllm()
            return models_file(default_entry(preload=True))
        return (
            "models:\n"
            f"  - id: {self.model}\n"
            "    backend: llama-server\n"
            f"    path: {real_engines.llama_server().gemma}\n"
            "    context_length: 2048\n"
            "    parallel: 2\n"
            "    preload: true\n"
        )


KINDS = {
    "llama-server": Kind("llama-server", "gemma", headers_report_streams=True, block=1),
    "vllm": Kind("vllm", DEFAULT_ID, headers_report_streams=False, block=128, real_vllm=True),
}


@dataclass
class Runner:
    kind: Kind
    proc: RunnerProcess

    @property
    def url(self) -> str:
        return self.proc.url

    @property
    def model(self) -> str:
        return self.kind.model


@pytest.fixture(scope="module", params=[pytest.param(k, id=k.name) for k in KINDS.values()])
def runner(request: pytest.FixtureRequest) -> Iterator[Runner]:
    kind: Kind = request.param
    env = {"GOVERNANCE_REGISTRY": str(DEV_REGISTRY), "ENGINE_STATS_INTERVAL_S": "0.5"}
    with start_runner(
        models_file=kind.models_file(), env=env, ready_timeout=START_TIMEOUT_S + 60
    ) as proc:
        yield Runner(kind, proc)


def _messages(content: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": PREAMBLE}, {"role": "user", "content": content}]


def _post(
    r: Runner, path: str, body: dict[str, Any], tenant: str, tag: str | None = None
) -> httpx.Response:
    headers = {"X-Tenant-ID": tenant} | ({"X-Cache-Tag": tag} if tag else {})
    return httpx.post(r.url + path, json={"model": r.model, **body}, headers=headers, timeout=300)


def chat(r: Runner, content: str, tenant: str, tag: str | None = None) -> httpx.Response:
    body = {"messages": _messages(content), "max_tokens": 2, "temperature": 0}
    return _post(r, "/v1/chat/completions", body, tenant, tag)


@dataclass(frozen=True)
class Streamed:
    headers: httpx.Headers
    events: list[dict[str, Any]]  # the `data:` events before [DONE], parsed
    done: bool
    raw: bytes


def stream(
    r: Runner, path: str, body: dict[str, Any], tenant: str, tag: str | None = None
) -> Streamed:
    headers = {"X-Tenant-ID": tenant} | ({"X-Cache-Tag": tag} if tag else {})
    full = {"model": r.model, "stream": True, **body}
    with httpx.stream("POST", r.url + path, json=full, headers=headers, timeout=300) as s:
        assert s.status_code == 200, s.read()
        raw = b"".join(s.iter_bytes())
    events, done = [], False
    for block in raw.split(b"\n\n"):
        if block == b"data: [DONE]":
            done = True
        elif block.startswith(b"data: "):
            events.append(orjson.loads(block[6:]))
    return Streamed(s.headers, events, done, raw)


def reused(answer: httpx.Response) -> int:
    """Tokens the engine reused for a whole answer, as the runner's headers say; the
    headers agree with the engine's own figure in the body."""
    hit = answer.headers["x-cache-hit"] == "true"
    tokens = int(answer.headers["x-cache-tokens-reused"])
    assert hit == (tokens > 0)
    details = answer.json()["usage"].get("prompt_tokens_details") or {}
    if "cached_tokens" in details:
        assert details["cached_tokens"] == tokens
    return tokens


def stream_reused(r: Runner, content: str, tenant: str, tag: str | None = None) -> int:
    """Tokens reused for a streamed answer: from its headers where the engine reports the
    cache before the first chunk, else from the usage chunk the client asked for."""
    body = {
        "messages": _messages(content),
        "max_tokens": 2,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    s = stream(r, "/v1/chat/completions", body, tenant, tag)
    assert s.done
    if r.kind.headers_report_streams:
        return int(s.headers["x-cache-tokens-reused"])
    usage = [e["usage"] for e in s.events if e.get("choices") == [] and e.get("usage")]
    assert len(usage) == 1, s.raw
    return int((usage[0].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def test_real_chat_and_completions_whole_and_streamed(runner: Runner) -> None:
    """Chat and completions answer whole and streamed, naming the model the client asked
    for, with the runner's headers (the engine's own time in X-GPU-Time-Ms when whole)."""
    whole = chat(runner, "Say hello.", "t-basic")
    assert whole.status_code == 200, whole.text
    assert whole.json()["model"] == runner.model
    assert whole.json()["choices"][0]["message"]["role"] == "assistant"
    assert int(whole.headers["x-gpu-time-ms"]) > 0
    assert whole.headers["x-request-id"]
    body = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    completion = _post(runner, "/v1/completions", body, "t-basic")
    assert completion.status_code == 200, completion.text
    assert completion.json()["choices"][0]["text"]
    for path, req in (
        ("/v1/chat/completions", {"messages": _messages("Hi."), "max_tokens": 3}),
        ("/v1/completions", body),
    ):
        s = stream(runner, path, req, "t-basic")
        assert s.done and s.events
        assert all(e["model"] == runner.model for e in s.events)
        assert all(e.get("choices") != [] for e in s.events)  # no usage chunk unasked
        assert s.headers["content-type"].startswith("text/event-stream")
        assert s.headers["x-cache-hit"] in ("true", "false")


def test_real_cache_report_whole_and_streamed(runner: Runner) -> None:
    """The same long prompt twice from one tenant: the second reuses the prompt, as the
    engine reports it, whole and streamed."""
    assert reused(chat(runner, "Question one?", "t-cache")) == 0
    again = reused(chat(runner, "Question one?", "t-cache"))
    assert again >= 512 and again % runner.kind.block == 0
    assert stream_reused(runner, "Question one?", "t-cache") >= 512


def test_real_other_tenant_never_reuses(runner: Runner) -> None:
    """A second tenant sending the first tenant's exact prompt reuses nothing; it reuses
    its own prompt on its repeat."""
    assert reused(chat(runner, "What is the code?", "iso-a")) == 0
    assert reused(chat(runner, "What is the code?", "iso-a")) > 0
    assert reused(chat(runner, "What is the code?", "iso-b")) == 0
    assert reused(chat(runner, "What is the code?", "iso-b")) > 0


def test_real_tag_flush_misses_only_that_tag(runner: Runner) -> None:
    """A tag flush: the tagged prompt's next request reuses nothing."""
    chat(runner, "Tagged question?", "t-tag", tag="sess-1")
    assert reused(chat(runner, "Tagged question?", "t-tag", tag="sess-1")) > 0
    result = flush(runner.url, "tag", tag="sess-1", modelId=runner.model)
    assert result.status_code == 200 and result.json()["flushed"] is True, result.text
    assert reused(chat(runner, "Tagged question?", "t-tag", tag="sess-1")) == 0


def test_real_tenant_flush_keeps_other_tenants(runner: Runner) -> None:
    """A tenant flush: that tenant's next request reuses nothing, another tenant's reuse
    survives; a flush of everything: nobody reuses."""
    for tenant in ("fl-a", "fl-b"):
        chat(runner, "Flush question?", tenant)
        assert reused(chat(runner, "Flush question?", tenant)) > 0
    result = flush(runner.url, "tenant", tenantId="fl-a", modelId=runner.model)
    assert result.status_code == 200 and result.json()["flushed"] is True, result.text
    assert reused(chat(runner, "Flush question?", "fl-a")) == 0
    assert reused(chat(runner, "Flush question?", "fl-b")) > 0
    result = flush(runner.url, "all")
    assert result.status_code == 200 and result.json()["flushed"] is True, result.text
    assert reused(chat(runner, "Flush question?", "fl-b")) == 0


def _engine_families(runner: Runner) -> dict[str, float]:
    """vLLM's own gauges, read from the engine the runner started, over the Unix socket its
    command line names (the test runs as the runner's user: nobody else can connect)."""
    pid = engine_pid(runner.proc.proc.pid, runner.kind.name)
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    sock = argv[argv.index("--uds") + 1]
    with httpx.Client(transport=httpx.HTTPTransport(uds=sock), timeout=10) as client:
        text = client.get("http://localhost/metrics").text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
            if sample.name == "vllm:kv_cache_usage_perc":
                out[sample.name] = sample.value
    return out


def test_real_vllm_figures_agree_with_the_engine(runner: Runner) -> None:
    """Idle, the runner's capabilities and /metrics/picker say what vLLM's own /metrics says:
    nothing running or waiting, and its KV cache size and version are known; the memory
    the runner accounts covers what the engine holds (within its drift since the load)."""
    if runner.kind.name != "vllm":
        pytest.skip("vLLM's own /metrics: the llama-server figures are tested in test_llama_real")
    engine = _engine_families(runner)
    assert engine["vllm:num_requests_running"] == 0
    assert engine["vllm:num_requests_waiting"] == 0

    def caps() -> dict[str, Any] | None:
        doc: dict[str, Any] = httpx.get(runner.url + "/v1/capabilities").json()
        return doc if doc["resources"]["kvCacheSizeMB"] > 0 and "-" in doc["runnerType"] else None

    doc = eventually(caps, timeout=30, what="the engine's figures in capabilities")
    assert doc["runnerType"] == "vllm-0.32.0"
    assert doc["resources"]["kvCacheSizeMB"] == 1024  # --kv-cache-memory-bytes 1 GiB
    assert doc["queue"]["depth"] == 0
    assert abs(doc["resources"]["kvCacheUtilization"] - engine["vllm:kv_cache_usage_perc"]) < 0.05
    loaded = {m["id"]: m for m in doc["models"]["loaded"]}
    memory = loaded[runner.model]["gpuMemoryMB"]
    assert memory > 1000  # measured: the engine's process tree
    # the device's used figure is the runner's leases, the engine's RSS measured once after
    # its load; the model's figure is its RSS now, which drifts a little as vLLM runs (4971
    # against 5004 MB seen under load): they agree, they are not the same reading
    assert doc["resources"]["gpuMemoryUsedMB"] >= 0.9 * memory
    metrics = httpx.get(runner.url + "/metrics/picker").text
    runner_values = {
        s.name: s.value
        for f in text_string_to_metric_families(metrics)
        for s in f.samples
        if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting")
    }
    assert runner_values == {"vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0}


def test_real_governed_unload_then_load_measure_memory(runner: Runner) -> None:
    """A governed unload stops the engine and reports the memory it freed, measured; a
    governed load answers 202, its task completes with the engine's measured memory.
    An unload asking vLLM to sleep is refused, naming why (sleep mode is off: on the CPU
    vLLM refuses to start with it), once its token is approved; the engine keeps serving."""
    pid = engine_pid(runner.proc.proc.pid, runner.kind.name)
    asleep = unload(runner.url, runner.model, mode="sleep")
    assert asleep.status_code == 400, asleep.text
    assert "sleep" in asleep.json()["error"]["message"]
    r = unload(runner.url, runner.model)
    assert r.status_code == 200, r.text
    assert r.json()["gpuMemoryFreedMB"] > 100
    eventually(lambda: not process_group(pid), timeout=60, what="the engine's processes gone")
    started = load(runner.url, runner.model)
    assert started.status_code == 202, started.text
    task = wait_task(runner.url, started.json()["taskId"], timeout=START_TIMEOUT_S + 60)
    assert task["status"] == "completed", task
    assert task["gpuMemoryUsedMB"] > 100 and task["loadTimeMs"] > 0
    assert chat(runner, "Back again?", "t-reload").status_code == 200


def test_real_engine_killed_midstream_one_clear_error(runner: Runner) -> None:
    """SIGKILL of the engine while it streams: the client's stream ends with one error
    event naming the crash and the signal; the runner stays up and says the model failed;
    nothing of the engine is left running."""
    pid = engine_pid(runner.proc.proc.pid, runner.kind.name)
    body = {
        "model": runner.model,
        "stream": True,
        "max_tokens": 400,
        "messages": [{"role": "user", "content": "Count slowly to two hundred."}],
    }
    with httpx.stream("POST", runner.url + "/v1/chat/completions", json=body, timeout=300) as s:
        chunks = s.iter_bytes()
        next(chunks)  # the answer has started
        os.kill(pid, signal.SIGKILL)
        rest = b"".join(chunks)
    errors = [b for b in rest.split(b"\n\n") if b.startswith(b"data: {") and b'"error"' in b]
    assert len(errors) == 1, rest[-2000:]
    error = orjson.loads(errors[0][6:])["error"]
    assert error["code"] == "engine_crashed" and "SIGKILL" in error["message"]
    assert httpx.get(runner.url + "/health/live").status_code == 200

    def failed() -> dict[str, Any] | None:
        doc = httpx.get(runner.url + "/v1/capabilities").json()
        return {f["id"]: f for f in doc["models"]["failed"]}.get(runner.model)

    assert eventually(failed, timeout=30, what="the model failed")["exitCode"] == -9
    eventually(lambda: not process_group(pid), timeout=60, what="no engine process left")


def engine_pid(runner_pid: int, kind: str) -> int:
    """The engine process this runner started (`llama-server`, or `vllm serve`)."""
    for pid, argv in processes_with(parent=runner_pid):
        if not argv:
            continue
        if (kind == "vllm" and "serve" in argv) or (kind != "vllm" and "llama-server" in argv[0]):
            return pid
    raise AssertionError(f"no {kind} engine process under runner {runner_pid}")

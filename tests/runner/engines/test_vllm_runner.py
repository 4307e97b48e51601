"""vLLM through the runner (issue 10's must-shows): the runner starts the fake `vllm`
executable (tests/fixtures/fake_vllm.py, vLLM 0.32.0's CLI and API) or attaches one by URL."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from adapters.vllm.launch import SEED_QUANTIZATION
from runner.lifecycle.load_requests import QUANTIZATIONS
from tests.fixtures.fake_vllm import BIN, process_env
from tests.support.engines import (
    GOVERNED,
    alive,
    caps,
    flush,
    load_and_wait,
    loaded,
    processes_with,
    unload,
)
from tests.support.engines import (
    process_env as env_of,
)
from tests.support.groups import end_group
from tests.support.poll import eventually
from tests.support.ports import free_port
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(120)

LONG = " ".join(f"w{i}" for i in range(40))  # two full 16-token blocks on the fake
MODELS = f"""models:
  - {{id: m, backend: vllm, hf: org/m, parallel: 1, preload: true, bin: '{BIN}'}}
  - {{id: n, backend: vllm, hf: org/n, parallel: 1, bin: '{BIN}'}}
"""
SETTINGS = {
    **GOVERNED,
    **process_env(CHUNK_DELAY_MS="100"),
    "RUNNER_MEMORY_MB": "81920",
    "VLLM_GPU_MEMORY_UTILIZATION": "0.3",
    "VLLM_MAX_MODEL_LEN": "8192",
    "VLLM_ENABLE_SLEEP_MODE": "true",
    "ENGINE_STATS_INTERVAL_S": "0.2",
}


@pytest.fixture(scope="module")
def runner() -> Iterator[RunnerProcess]:
    with start_runner(models_file=MODELS, env=SETTINGS, ready_timeout=60) as r:
        RUNNER_PID.append(r.proc.pid)
        yield r


def chat(url: str, tenant: str, **extra: Any) -> httpx.Response:
    body = {"model": extra.pop("model", "m"), "messages": [{"role": "user", "content": LONG}]}
    return httpx.post(
        url + "/v1/chat/completions", json={**body, **extra}, headers={"X-Tenant-ID": tenant}
    )


def reused(url: str, tenant: str, **extra: Any) -> int:
    r = chat(url, tenant, **extra)
    assert r.status_code == 200, r.text
    return int(r.headers["x-cache-tokens-reused"])


RUNNER_PID: list[int] = []


def engine(model: str) -> tuple[int, list[str]]:
    """(pid, argv) of the fake vllm the runner started for `model` (argv after `-m`)."""
    found = processes_with(
        "tests.fixtures.fake_vllm", "--served-model-name", model, parent=RUNNER_PID[-1]
    )
    assert len(found) == 1, found
    pid, argv = found[0]
    return pid, argv[argv.index("tests.fixtures.fake_vllm") + 1 :]


def fake_stats(model: str) -> dict[str, Any]:
    _, argv = engine(model)
    sock = argv[argv.index("--uds") + 1]  # the engine listens on its private socket only
    with httpx.Client(transport=httpx.HTTPTransport(uds=sock)) as client:
        stats: dict[str, Any] = client.get("http://localhost/_fake/stats").json()
    return stats


def test_vllm_load_api_quantizations_are_the_adapters() -> None:
    """The load API accepts exactly the quantizations the vLLM adapter maps."""
    assert set(QUANTIZATIONS) == set(SEED_QUANTIZATION)


def test_vllm_load_starts_the_exact_command_line(runner: RunnerProcess) -> None:
    """A load with every parameter starts `vllm serve` with exactly these flags: the budget
    as a fraction of the GPU's total (20480 of 81920 MB), the context length, the mapped
    quantization, max-num-seqs = the model's slots; it listens on a Unix socket in a folder
    only the runner's user may enter, and its key and dev mode are in its environment."""
    done = load_and_wait(
        runner.url, "n", quantization="awq-4bit", maxContextLength=4096, gpuMemoryBudgetMB=20480
    )
    assert done["status"] == "completed", done.get("error")
    pid, argv = engine("n")
    sock = argv[argv.index("--uds") + 1]
    assert argv == [
        "serve", "org/n", "--uds", sock,
        "--served-model-name", "n", "--gpu-memory-utilization", "0.25",
        "--max-model-len", "4096", "--quantization", "awq", "--enable-prefix-caching",
        "--max-num-seqs", "1", "--enable-prompt-tokens-details", "--enable-per-request-metrics",
        "--enable-sleep-mode",
    ]  # fmt: skip
    assert (
        sock.endswith("/engine.sock")
        and stat.S_IMODE(os.stat(os.path.dirname(sock)).st_mode) == 0o700
    )
    env = env_of(pid)
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert len(env["VLLM_API_KEY"]) == 48
    entry = {m["id"]: m for m in caps(runner.url)["models"]["loaded"]}["n"]
    assert entry["quantization"] == "awq-4bit" and entry["contextLength"] == 4096
    assert unload(runner.url, "n").status_code == 200
    assert not alive(pid)


def test_vllm_settings_apply_without_load_parameters(runner: RunnerProcess) -> None:
    """Without parameters: VLLM_GPU_MEMORY_UTILIZATION and VLLM_MAX_MODEL_LEN."""
    _, argv = engine("m")
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.3"
    assert argv[argv.index("--max-model-len") + 1] == "8192"
    assert "--quantization" not in argv and "--dtype" not in argv


def test_vllm_unknown_quantization_is_400_before_governance(runner: RunnerProcess) -> None:
    """An unknown quantization is refused with 400, no token needed, nothing started."""
    r = httpx.post(runner.url + "/v1/models/load", json={"modelId": "n", "quantization": "int3"})
    assert r.status_code == 400 and "quantization" in r.json()["error"]["message"]


def test_vllm_tenant_flush_makes_a_cached_prompt_miss(runner: RunnerProcess) -> None:
    """Tenant A's prompt hits its own cache, never B's; after A's flush (the salt rotated)
    A's next identical prompt misses on the engine, and B's cache is untouched."""
    url = runner.url
    reused(url, "flush-a")
    assert reused(url, "flush-a") == 32
    reused(url, "flush-b")
    assert reused(url, "flush-b") == 32
    assert reused(url, "flush-c") == 0  # a third tenant never hits the others' blocks
    r = flush(url, "tenant", tenantId="flush-a")
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["flushed"] is True and answer["entriesRemoved"] >= 1
    assert reused(url, "flush-a") == 0
    assert reused(url, "flush-b") == 32


def test_vllm_client_cache_salt_never_reaches_the_engine(runner: RunnerProcess) -> None:
    """A client's own cache_salt is replaced by the runner's salt for its tenant."""
    assert chat(runner.url, "salty", cache_salt="the-clients-own-salt").status_code == 200
    sent = fake_stats("m")["last_body"]
    assert sent["cache_salt"] != "the-clients-own-salt" and len(sent["cache_salt"]) == 43
    assert chat(runner.url, "other-salty").status_code == 200
    assert fake_stats("m")["last_body"]["cache_salt"] != sent["cache_salt"]


def test_vllm_capabilities_reflect_the_fakes_metrics(runner: RunnerProcess) -> None:
    """While a stream runs, capabilities show vLLM's running request and its KV cache use
    (from its /metrics); after it, both are back to 0."""
    assert caps(runner.url)["resources"]["kvCacheSizeMB"] > 0  # vLLM's start-up log
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(chat, runner.url, "metrics", stream=True, max_tokens=30)
        # the KV figure comes from the engine watch's next scrape (ENGINE_STATS_INTERVAL_S)
        # after the grant: wait for both, while the stream runs
        eventually(
            lambda: (
                (d := caps(runner.url))["queue"]["running"] == 1
                and d["resources"]["kvCacheUtilization"] > 0
            ),
            20,
            "running, with its KV use scraped",
        )
        assert held.result(60).status_code == 200
    eventually(
        lambda: (
            (d := caps(runner.url))["queue"]["running"] == 0
            and d["resources"]["kvCacheUtilization"] == 0
        ),
        20,
        "idle, with the engine's KV use scraped at 0",
    )


def test_vllm_sleep_and_wake_through_unload_and_load(runner: RunnerProcess) -> None:
    """Unload with mode sleep puts the engine to sleep (process kept, memory measured, the
    model not served); the next load wakes the same process up and it serves again."""
    url = runner.url
    assert load_and_wait(url, "n")["status"] == "completed"
    pid, _ = engine("n")
    r = unload(url, "n", mode="sleep")
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["modelId"] == "n" and answer["mode"] == "sleep"
    assert answer["kvCacheFlushed"] is True and answer["gpuMemoryFreedMB"] >= 0
    state = fake_stats("n")
    assert state["state"]["sleeping"] is True and state["by_path"].get("/sleep") == 1
    assert "n" not in loaded(url)
    assert chat(url, "sleepy", model="n").json()["error"]["code"] == "model_not_loaded"
    done = load_and_wait(url, "n")
    assert done["status"] == "completed" and done["gpuMemoryUsedMB"] >= 0
    assert engine("n")[0] == pid  # woken up, not started again
    state = fake_stats("n")
    assert state["state"]["sleeping"] is False and state["by_path"].get("/wake_up") == 1
    assert chat(url, "sleepy", model="n").status_code == 200
    assert unload(url, "n").status_code == 200
    eventually(lambda: not alive(pid), 10, "engine stopped")


# -- a vLLM attached by URL ----------------------------------------------------------------


@pytest.fixture(scope="module")
def attached() -> Iterator[tuple[RunnerProcess, str]]:
    """A fake vLLM started by hand (one sequence at a time, dev mode), attached by URL with
    two slots, so a second request waits inside vLLM."""
    port = free_port()
    env = {
        **os.environ,
        **process_env(CHUNK_DELAY_MS="100"),
        "VLLM_SERVER_DEV_MODE": "1",
    }
    argv = [str(BIN), "serve", "org/a", "--port", str(port), "--served-model-name", "a"]
    argv += ["--max-num-seqs", "1", "--enable-prompt-tokens-details"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        eventually(lambda: _healthy(url), 30, "the attached fake vllm")
        models = f"models:\n  - {{id: a, backend: vllm, url: '{url}', parallel: 2}}\n"
        env = {**GOVERNED, "ENGINE_STATS_INTERVAL_S": "0.2", "VLLM_ENABLE_SLEEP_MODE": "true"}
        with start_runner(models_file=models, env=env) as r:
            yield r, url
    finally:
        end_group(proc)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_vllm_attached_keeps_tenants_apart_with_salts(attached: tuple[RunnerProcess, str]) -> None:
    """An attached vLLM gets the runner's salt per tenant too: A hits its own cache, B does
    not; a model flush resets vLLM's prefix cache (dev mode)."""
    runner, url = attached
    reused(runner.url, "att-a", model="a")
    assert reused(runner.url, "att-a", model="a") == 32
    assert reused(runner.url, "att-b", model="a") == 0
    sent = httpx.get(url + "/_fake/stats").json()["last_body"]
    assert len(sent["cache_salt"]) == 43
    r = flush(runner.url, "model", modelId="a")
    assert r.status_code == 200 and r.json()["flushed"] is True, r.text
    assert reused(runner.url, "att-a", model="a") == 0


def test_vllm_attached_waiting_requests_count_in_the_queue(
    attached: tuple[RunnerProcess, str],
) -> None:
    """Two streams on a vLLM with one sequence: vLLM runs one and queues one, and the
    runner's capabilities count the queued one in `queue.depth`."""
    runner, _ = attached
    with ThreadPoolExecutor(2) as pool:
        streams = [
            pool.submit(chat, runner.url, f"wait-{i}", model="a", stream=True, max_tokens=30)
            for i in range(2)
        ]
        doc = eventually(
            lambda: (d := caps(runner.url))["queue"]["depth"] >= 1 and d, 20, "a waiting one"
        )
        assert doc["queue"]["running"] == 1
        assert all(s.result(60).status_code == 200 for s in streams)


def test_vllm_attached_cannot_sleep(attached: tuple[RunnerProcess, str]) -> None:
    """Sleep is for engines the runner started: 400 (told once a token is approved)."""
    runner, _ = attached
    r = unload(runner.url, "a", mode="sleep")
    assert r.status_code == 400 and "sleep" in r.json()["error"]["message"]


def test_vllm_runner_type_names_the_engine_version(attached: tuple[RunnerProcess, str]) -> None:
    """runnerType is `vllm-<the engine's /version>` once the engine watch has read it (the
    kind's name alone before); nothing else claims more than vLLM."""
    doc = eventually(
        lambda: (d := caps(attached[0].url))["runnerType"] != "vllm" and d, 20, "the version"
    )
    assert doc["runnerType"] == "vllm-0.32.0"
    assert doc["capabilities"]["streaming"] and doc["capabilities"]["prefixCaching"]

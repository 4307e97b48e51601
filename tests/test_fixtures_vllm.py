"""The fake `vllm` follows vLLM's CLI and HTTP API (tests/fixtures/fake_vllm.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import orjson
import pytest

from adapters.supervisor import EngineProcess
from tests.fixtures._vllm_cache import PrefixCache, block_hashes
from tests.fixtures.fake_vllm import BIN, process_env
from tests.support.ports import free_port

KEY = "k-test"
WORDS = " ".join(f"w{i}" for i in range(40))  # 40 tokens: two full 16-token blocks


class Fake:
    def __init__(self, port: int, proc: EngineProcess) -> None:
        self.port = port
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"
        self.client = httpx.AsyncClient(base_url=self.url, timeout=10.0)
        self.auth = {"Authorization": f"Bearer {KEY}"}

    async def chat(self, body: dict[str, Any]) -> httpx.Response:
        return await self.client.post("/v1/chat/completions", json=body, headers=self.auth)

    async def cached(self, salt: str | None = None) -> int:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": WORDS}]}
        if salt is not None:
            body["cache_salt"] = salt
        r = await self.chat(body)
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def _argv(port: int, *flags: str) -> list[str]:
    return [
        str(BIN), "serve", "org/model", "--host", "127.0.0.1", "--port", str(port),
        "--api-key", KEY, "--served-model-name", "m", "--enable-prompt-tokens-details", *flags,
    ]  # fmt: skip


async def _start(*flags: str, dev: bool = True, **fake: str) -> Fake:
    port = free_port()
    env = {**process_env(**fake), "VLLM_SERVER_DEV_MODE": "1" if dev else "0"}

    async def healthy() -> bool:
        async with httpx.AsyncClient(timeout=1.0) as c:
            return (await c.get(f"http://127.0.0.1:{port}/health")).status_code == 200

    proc = EngineProcess("fake-vllm", _argv(port, *flags), healthy, env=env, load_timeout_s=20)
    await proc.start()
    return Fake(port, proc)


@pytest.fixture
async def fake() -> AsyncIterator[Fake]:
    f = await _start()
    yield f
    await f.client.aclose()
    await f.proc.stop(grace_s=5)


def _run_cli(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **process_env(), **(env or {})},
    )


def test_fake_vllm_unknown_flag_exits_2_like_argparse() -> None:
    """A flag vLLM does not know ends the process with argparse's error and exit code 2."""
    done = _run_cli("serve", "org/model", "--port", "1", "--no-such-flag")
    assert done.returncode == 2
    assert "vllm: error: unrecognized arguments: --no-such-flag" in done.stderr


def test_fake_vllm_unknown_quantization_exits_1_with_vllm_message() -> None:
    """An unknown `--quantization` passes argparse and fails the config check, exit code 1."""
    done = _run_cli("serve", "org/model", "--port", str(free_port()), "--quantization", "awq-4bit")
    assert done.returncode == 1
    assert "Unknown quantization method: awq-4bit. Must be one of" in done.stdout


def test_fake_vllm_accepts_underscores_and_model_flag() -> None:
    """`--max_model_len` means `--max-model-len`, and `--model X` works as the positional."""
    done = _run_cli("serve", "--model", "org/model", "--max_model_len", "999999", "--port", "1")
    assert done.returncode == 1
    assert "User-specified max_model_len (999999) is greater than the derived" in done.stdout


async def test_fake_vllm_api_key_guards_only_v1_paths(fake: Fake) -> None:
    """Without the key `/v1/*` answers 401; `/health`, `/metrics` and dev routes do not ask."""
    r = await fake.client.get("/v1/models")
    assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
    assert (await fake.client.get("/health")).status_code == 200
    assert (await fake.client.get("/metrics")).status_code == 200
    assert (await fake.client.get("/is_sleeping")).json() == {"is_sleeping": False}
    models = (await fake.client.get("/v1/models", headers=fake.auth)).json()
    assert models["data"][0]["id"] == "m" and models["data"][0]["root"] == "org/model"


async def test_fake_vllm_dev_routes_404_without_dev_mode() -> None:
    """Without VLLM_SERVER_DEV_MODE=1 the reset, sleep and wake routes do not exist."""
    f = await _start(dev=False)
    try:
        for path in ("/reset_prefix_cache", "/sleep", "/wake_up"):
            assert (await f.client.post(path)).status_code == 404
        assert (await f.client.get("/is_sleeping")).status_code == 404
    finally:
        await f.client.aclose()
        await f.proc.stop(grace_s=5)


async def test_fake_vllm_cache_salt_separates_caches(fake: Fake) -> None:
    """Same salt shares blocks, another salt does not, unsalted requests share with each other."""
    assert await fake.cached() == 0
    assert await fake.cached() == 32
    assert await fake.cached("salt-a") == 0
    assert await fake.cached("salt-a") == 32
    assert await fake.cached("salt-b") == 0


async def test_fake_vllm_refuses_a_salt_vllm_refuses(fake: Fake) -> None:
    """A salt with `/` (plain base64) is a 400 naming `cache_salt`, as in vLLM."""
    r = await fake.chat({"messages": [{"role": "user", "content": "x"}], "cache_salt": "a/b"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "cache_salt"


async def test_fake_vllm_stream_usage_only_when_asked(fake: Fake) -> None:
    """A stream ends with a `choices: []` usage chunk only with `stream_options.include_usage`."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": WORDS}], "stream": True}
    plain = (await fake.chat(body)).text
    assert '"usage"' not in plain and plain.endswith("data: [DONE]\n\n")
    first = orjson.loads(plain.split("\n\n")[0].removeprefix("data: "))
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    events = (await fake.chat({**body, "stream_options": {"include_usage": True}})).text
    last = orjson.loads(events.split("\n\n")[-3].removeprefix("data: "))
    assert last["choices"] == []
    details = last["usage"]["prompt_tokens_details"]  # chat's: the tokens it wrote too
    assert details == {"cached_tokens": 32, "created_cache_tokens": 0}


async def test_fake_vllm_reset_prefix_cache_empties_it(fake: Fake) -> None:
    """`POST /reset_prefix_cache` answers `{"success": true}` and the next prompt misses."""
    await fake.cached()
    assert await fake.cached() == 32
    assert (await fake.client.post("/reset_prefix_cache")).json() == {"success": True}
    assert await fake.cached() == 0


async def test_fake_vllm_crash_after_dies_mid_stream() -> None:
    """`FAKE_VLLM_MODE=crash_after`: the stream stops after N chunks and the process exits 1."""
    f = await _start(MODE="crash_after", CRASH_AFTER="1")
    body = {"messages": [{"role": "user", "content": WORDS}], "stream": True}
    try:
        with pytest.raises(httpx.HTTPError):
            await f.chat(body)
        info = await f.proc.wait_exit()
        assert info.returncode == 1
    finally:
        await f.client.aclose()
        await f.proc.stop(grace_s=5)


async def test_fake_vllm_slow_start_refuses_connections_while_loading() -> None:
    """`slow_start`: the port is bound but refuses connections until the engine is up."""
    port = free_port()
    env = {**os.environ, **process_env(MODE="slow_start", START_S="30")}
    with subprocess.Popen(
        _argv(port), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    ) as proc:
        try:
            assert proc.stdout is not None
            proc.stdout.readline()  # the version line: the start-up is under way
            assert _port_taken_within(port, 10.0)  # bound, as vLLM binds before loading
            with socket.socket() as s:
                s.settimeout(2)
                with pytest.raises(ConnectionRefusedError):
                    s.connect(("127.0.0.1", port))
        finally:
            proc.kill()


def _port_taken_within(port: int, seconds: float) -> bool:
    """Whether some socket holds `port` (our own bind fails) before `seconds` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return True
        time.sleep(0.02)
    return False


def test_fake_vllm_cache_hits_stop_before_the_last_token() -> None:
    """A prompt of exactly two blocks hits one block: its last token is always recomputed."""
    cache = PrefixCache(block_size=16, capacity=100, enabled=True)
    tokens = list(range(32))
    assert cache.lookup_and_store(tokens, None) == 0
    assert cache.lookup_and_store(tokens, None) == 16
    assert cache.lookup_and_store([*tokens, 99], None) == 32


def test_fake_vllm_salt_changes_every_block_hash() -> None:
    """The salt enters the first block's hash, so all chained hashes differ."""
    tokens = list(range(48))
    plain, salted = block_hashes(tokens, 16, None), block_hashes(tokens, 16, "s")
    assert len(plain) == 3 and all(a != b for a, b in zip(plain, salted, strict=True))


def test_fake_vllm_per_request_metrics_need_log_stats() -> None:
    """`--enable-per-request-metrics` with `--disable-log-stats` exits 1 with vLLM's error."""
    flags = ("--enable-per-request-metrics", "--disable-log-stats")
    done = _run_cli("serve", "org/model", "--port", str(free_port()), *flags)
    assert done.returncode == 1
    assert "--enable-per-request-metrics requires engine statistics logging" in done.stdout


async def test_fake_vllm_per_request_metrics_only_with_the_flag(fake: Fake) -> None:
    """Timings (`metrics`) come in whole answers and the usage chunk only with
    `--enable-per-request-metrics`; without it a whole answer's `metrics` is null."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": WORDS}], "max_tokens": 3}
    assert (await fake.chat(body)).json()["metrics"] is None
    on = await _start("--enable-per-request-metrics")
    try:
        timings = (await on.chat(body)).json()["metrics"]
        assert timings["tokens_per_second"] > 0 and timings["mean_itl_ms"] >= 0
        stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
        events = (await on.chat(stream)).text.split("\n\n")
        last = orjson.loads(events[-3].removeprefix("data: "))
        assert set(last["metrics"]) == set(timings) - {"speculative_decoding"}
    finally:
        await on.client.aclose()
        await on.proc.stop(grace_s=5)

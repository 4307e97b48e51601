"""The vLLM adapter: its command line, request rewriting, and a real fake `vllm` process."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from adapters.base import ChatEngine, FlushScope
from adapters.engine_families import EngineFamiliesCollector
from adapters.errors import (
    EngineControlFailed,
    EngineOutOfMemory,
    EngineStartFailed,
    EngineUnavailable,
    UnsupportedRequest,
)
from adapters.supervisor import EngineProcess, EngineState
from adapters.vllm.engine import (
    CacheSalts,
    Standby,
    VllmEngine,
    VllmLaunchOptions,
    command_line,
    engine_env,
    launch_options,
    memory_fraction,
    start_failure_cause,
    strip_usage_chunk,
    with_fields,
)
from adapters.vllm.kind import launch
from adapters.vllm.launch import lora_rank_for
from tests.fixtures.fake_vllm import BIN, process_env
from tests.support.ports import free_port

SECRET = b"runner-secret-0123456789abcdef"
WORDS = " ".join(f"w{i}" for i in range(40))  # two full 16-token blocks on the fake


def _options(**overrides: Any) -> VllmLaunchOptions:
    params: dict[str, Any] = {
        "binary": str(BIN),
        "model": "org/model",
        "model_id": "m",
        "port": free_port(),
        "api_key": "k" * 48,
        "slots": 4,
        "quantization": None,
        "max_context_length": 4096,
        "default_max_model_len": None,
        "gpu_memory_budget_mb": None,
        "gpu_total_mb": 81920,
        "default_gpu_memory_utilization": 0.5,
        "enable_prefix_caching": True,
        "enable_sleep_mode": True,
    }
    params.update(overrides)
    return launch_options(**params)


# -- command line (pure) ----------------------------------------------------------------


def test_command_line_load_request_with_every_parameter() -> None:
    """Every load parameter and setting lands on vLLM's flag, in one exact argv and env;
    it listens on its private Unix socket, and the key is in its environment only."""
    opts = launch_options(
        binary="/opt/vllm/bin/vllm",
        model="Qwen/Qwen2.5-7B-Instruct-AWQ",
        model_id="qwen-7b",
        port=None,
        uds="/tmp/quorum-vllm-x/engine.sock",
        api_key="abc123",
        slots=8,
        quantization="awq-4bit",
        max_context_length=16384,
        default_max_model_len=8192,
        gpu_memory_budget_mb=20480,
        gpu_total_mb=81920,
        default_gpu_memory_utilization=0.9,
        enable_prefix_caching=False,
        enable_sleep_mode=True,
        cuda_visible_devices="1",
        extra_args=["--seed", "7"],
    )
    assert command_line(opts) == [
        "/opt/vllm/bin/vllm", "serve", "Qwen/Qwen2.5-7B-Instruct-AWQ",
        "--uds", "/tmp/quorum-vllm-x/engine.sock",
        "--served-model-name", "qwen-7b", "--gpu-memory-utilization", "0.25",
        "--max-model-len", "16384", "--quantization", "awq",
        "--no-enable-prefix-caching", "--max-num-seqs", "8", "--enable-prompt-tokens-details",
        "--enable-per-request-metrics", "--enable-sleep-mode", "--seed", "7",
    ]  # fmt: skip
    assert engine_env(opts) == {
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_API_KEY": "abc123",
        "CUDA_VISIBLE_DEVICES": "1",
    }


def test_command_line_on_a_port_keeps_the_key_off_it() -> None:
    """On a loopback port instead (an engine the runner does not start the usual way): the
    key is still in the environment only, never on the command line (`ps`)."""
    argv = command_line(_options(port=8123))
    assert argv[3:7] == ["--host", "127.0.0.1", "--port", "8123"]
    assert "--api-key" not in argv and "--uds" not in argv
    with pytest.raises(ValueError, match="exactly one"):
        _options(port=8123, uds="/tmp/s.sock")


def test_command_line_defaults_from_settings() -> None:
    """Without load parameters: VLLM_GPU_MEMORY_UTILIZATION and VLLM_MAX_MODEL_LEN apply."""
    opts = _options(max_context_length=None, default_max_model_len=8192, enable_sleep_mode=False)
    argv = command_line(opts)
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.5"
    assert argv[argv.index("--max-model-len") + 1] == "8192"
    assert "--enable-prefix-caching" in argv and "--enable-sleep-mode" not in argv
    assert "--quantization" not in argv and "--dtype" not in argv


@pytest.mark.parametrize(("seed", "dtype"), [("fp16", "float16"), ("bf16", "bfloat16")])
def test_launch_options_float_formats_become_dtype(seed: str, dtype: str) -> None:
    """fp16/bf16 are weight dtypes in vLLM: `--dtype`, never `--quantization`."""
    argv = command_line(_options(quantization=seed))
    assert argv[argv.index("--dtype") + 1] == dtype
    assert "--quantization" not in argv


def test_launch_options_unknown_quantization_is_400_before_anything_runs() -> None:
    """An unknown quantization is refused while building the options: nothing is spawned."""
    with pytest.raises(UnsupportedRequest) as err:
        _options(quantization="int3-magic")
    assert err.value.status == 400
    assert "int3-magic" in str(err.value)


def test_memory_fraction_rounds_down_and_refuses_impossible_budgets() -> None:
    """The fraction never exceeds the budget; no total, or a budget above it, is a 400."""
    assert memory_fraction(30000, 81920, 0.9) == 0.3662
    assert memory_fraction(None, None, 0.9) == 0.9
    for budget, total in ((1000, None), (90000, 81920), (0, 81920)):
        with pytest.raises(UnsupportedRequest):
            memory_fraction(budget, total, 0.9)


def test_start_failure_cause_finds_oom_far_above_the_end() -> None:
    """vLLM's root cause is found above the API server's long traceback, and marked OOM."""
    lines = ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB."]
    lines += ["  File x"] * 40 + ["RuntimeError: Engine core initialization failed. See ..."]
    cause, oom = start_failure_cause(lines)
    assert cause is not None and cause.startswith("CUDA out of memory") and oom


# -- requests (pure) --------------------------------------------------------------------


def _engine(salts: CacheSalts | None = None) -> VllmEngine:
    return VllmEngine("m", "http://127.0.0.1:1", 4, None, None, salts)  # type: ignore[arg-type]


def test_vllm_engine_is_an_engine_whose_headers_do_not_wait() -> None:
    """VllmEngine satisfies the chat path's ChatEngine protocol (mypy checks the assignment);
    its first chunk has no cache report, so headers do not wait for it."""
    engine: ChatEngine = _engine()
    assert not engine.holds_headers_for_first_chunk
    assert engine.first_chunk_report(b'data: {"choices":[]}\n\n') is None


def test_rewrite_drops_the_clients_cache_fields() -> None:
    """A client's cache_salt and kv_transfer_params never go on to vLLM."""
    body: dict[str, Any] = {"messages": [], "cache_salt": "mine", "kv_transfer_params": {}}
    assert _engine(CacheSalts(SECRET)).rewrite(body, "auto", "a") is True
    assert body == {"messages": []}


async def test_place_asks_for_stream_usage_and_strips_it_for_the_client() -> None:
    """A stream gets `include_usage` (other options kept) and a strip for the usage chunk."""
    obj: dict[str, Any] = {"stream": True, "stream_options": {"continuous_usage_stats": False}}
    placed = await _engine(None).place(orjson.dumps(obj), obj, "a", None)
    sent = orjson.loads(placed.body)
    assert sent["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert placed.strip is strip_usage_chunk
    events = (
        b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":3}}\n\ndata: [DONE]\n\n'
    )
    assert strip_usage_chunk(events) == (
        b'data: {"choices":[{"delta":{"content":"x"}}]}\n\ndata: [DONE]\n\n'
    )


async def test_place_leaves_the_usage_chunk_to_a_client_that_asked() -> None:
    """A client that asked for usage gets its chunk: no strip."""
    obj: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True}}
    placed = await _engine(None).place(orjson.dumps(obj), obj, "a", None)
    assert placed.strip is None


def test_rewrite_cache_mode_none_sends_a_one_off_salt() -> None:
    """`X-Cache-Mode: none` gets a fresh random salt per request, which `place` keeps."""
    engine = _engine(CacheSalts(SECRET))
    first: dict[str, Any] = {"prompt": "x"}
    second: dict[str, Any] = {"prompt": "x"}
    engine.rewrite(first, "none", "a")
    engine.rewrite(second, "none", "a")
    assert first["cache_salt"] != second["cache_salt"]


async def test_place_splices_the_tenant_salt_into_the_body() -> None:
    """The placed body carries the runner's salt for (tenant, tag) and nothing else changes."""
    salts = CacheSalts(SECRET)
    obj = {"model": "m", "prompt": "hello"}
    placed = await _engine(salts).place(orjson.dumps(obj), obj, "a", "t")
    assert orjson.loads(placed.body) == {**obj, "cache_salt": salts.salt("a", "t")}
    assert placed.body.startswith(b'{"cache_salt":')  # spliced, not re-serialized
    assert orjson.loads(with_fields(b"{}", {}, {"cache_salt": "s"})) == {"cache_salt": "s"}


def test_command_line_lora_flags_only_with_adapters() -> None:
    """With adapters (or room for them) vLLM starts with LoRA on, the declared ones served
    from start in the JSON form (any path), at most a batch's worth active at once, a rank
    holding theirs, and runtime loading allowed; without, none of it."""
    plain = _options()
    assert "--enable-lora" not in command_line(plain)
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in engine_env(plain)
    opts = _options(
        slots=2,
        lora_modules=[("alpha", "/a/al,pha=1")],
        adapter_capacity=3,
        lora_ranks=[8, None],
    )
    argv = command_line(opts)
    assert "--enable-lora" in argv
    assert argv[argv.index("--max-loras") + 1] == "2"  # a batch: at most the slots
    assert argv[argv.index("--max-cpu-loras") + 1] == "3"
    assert argv[argv.index("--max-lora-rank") + 1] == "16"
    module = orjson.loads(argv[argv.index("--lora-modules") + 1])
    assert module == {"name": "alpha", "path": "/a/al,pha=1"}
    assert engine_env(opts)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert lora_rank_for([100]) == 128 and lora_rank_for([1000]) == 0


async def test_place_names_the_adapter_as_the_model() -> None:
    """An adapter's request goes to vLLM with `model` = the adapter's vLLM name; an adapter
    the engine does not hold is refused."""
    engine = _engine(None)
    engine.adapters = {"m:alpha": "alpha"}
    obj = {"model": "m", "prompt": "x"}
    placed = await engine.place(orjson.dumps(obj), obj, "a", None, "m:alpha")
    assert orjson.loads(placed.body)["model"] == "alpha"
    with pytest.raises(EngineUnavailable):
        await engine.place(orjson.dumps(obj), obj, "a", None, "m:other")


async def test_place_without_isolation_sends_no_salt() -> None:
    """A shared-cache model (no salts) forwards the body as it is."""
    body = b'{"prompt":"x"}'
    assert (await _engine(None).place(body, {"prompt": "x"}, "a", None)).body == body


# -- against the fake `vllm` process ------------------------------------------------------


class Running:
    def __init__(self, process: EngineProcess, engine: VllmEngine) -> None:
        self.process = process
        self.engine = engine

    async def ask(self, tenant: str, tag: str | None = None, **extra: Any) -> dict[str, Any]:
        """One request through the adapter as the data path sends it; the parsed answer."""
        obj: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": WORDS}]}
        obj.update(extra)
        self.engine.rewrite(obj, "auto", tenant)
        placed = await self.engine.place(orjson.dumps(obj), obj, tenant, tag)
        resp = await self.engine.http.post("/v1/chat/completions", placed.body)
        async with resp:
            data: bytes = await resp.read()
        assert resp.status == 200, data
        if obj.get("stream"):
            events = [e.removeprefix(b"data: ") for e in data.split(b"\n\n") if e]
            return dict(orjson.loads(events[-2]))
        return dict(orjson.loads(data))

    async def cached(self, tenant: str, tag: str | None = None) -> int:
        return self.engine.report(await self.ask(tenant, tag)).tokens_reused

    async def fake_stats(self) -> dict[str, Any]:
        r = await self.engine.control.get("/_fake/stats")
        return dict(r.json())


async def _launch(slots: int = 4, binary: str = str(BIN), **fake: str) -> Running:
    opts = _options(slots=slots, binary=binary)
    engine_holder: list[VllmEngine] = []

    async def probe() -> int | None:
        stats = await Running(process, engine_holder[0]).fake_stats()
        return int(stats["state"]["gpu_memory_used_mb"])

    process, engine = await launch(
        opts,
        salts=CacheSalts(SECRET),
        load_timeout_s=20,
        env={**process_env(**fake), "PATH": f"{BIN.parent}:{os.environ.get('PATH', '')}"},
        memory_probe=probe,
        metrics_sink=EngineFamiliesCollector(),
    )
    engine_holder.append(engine)
    return Running(process, engine)


@pytest.fixture
async def vllm() -> AsyncIterator[Running]:
    running = await _launch()
    yield running
    running.engine.http.close()
    await running.engine.control.aclose()
    await running.process.stop(grace_s=5)


async def test_vllm_engine_starts_with_its_command_line_and_reads_kv_capacity(
    vllm: Running,
) -> None:
    """The fake accepts the adapter's argv (it refuses unknown flags); KV size is read."""
    assert vllm.process.state is EngineState.READY
    assert vllm.engine.kv_cache_tokens == 32768 and vllm.engine.kv_size_mb > 0


async def test_vllm_tenant_flush_makes_a_cached_prompt_miss(vllm: Running) -> None:
    """A prompt cached for tenant A misses after A's flush; B never hit A's cache."""
    assert await vllm.cached("a") == 0
    assert await vllm.cached("a") == 32
    assert await vllm.cached("b") == 0
    result = await vllm.engine.flush(FlushScope("tenant", tenant_id="a"))
    assert result.flushed and result.entries_removed == 1
    assert result.reason is not None and "salt rotated" in result.reason
    assert await vllm.cached("a") == 0
    assert await vllm.cached("b") == 32


async def test_vllm_tag_flush_rotates_only_that_tag(vllm: Running) -> None:
    """A tag flush makes the tag's prompts miss and leaves the tenant's untagged cache."""
    await vllm.cached("a", "t")
    await vllm.cached("a")
    await vllm.engine.flush(FlushScope("tag", tenant_id="a", tag="t"))
    assert await vllm.cached("a", "t") == 0
    assert await vllm.cached("a") == 32


async def test_vllm_client_cache_salt_never_reaches_the_engine(vllm: Running) -> None:
    """The engine sees the runner's salt for the tenant, not the one the client sent."""
    await vllm.ask("a", cache_salt="client-chosen")
    sent = (await vllm.fake_stats())["last_body"]
    assert sent["cache_salt"] == CacheSalts(SECRET).salt("a", None)


async def test_vllm_model_flush_resets_the_prefix_cache(vllm: Running) -> None:
    """A model flush calls /reset_prefix_cache: every tenant's next prompt misses."""
    await vllm.cached("a")
    assert await vllm.cached("a") == 32
    result = await vllm.engine.flush(FlushScope("model", model_id="m"))
    assert result.flushed
    assert await vllm.cached("a") == 0
    assert (await vllm.fake_stats())["by_path"]["/reset_prefix_cache"] == 1


async def test_vllm_streamed_answer_reports_from_its_usage_chunk(vllm: Running) -> None:
    """A stream the client asked plainly still ends with usage, cached tokens included."""
    await vllm.ask("a")
    last = await vllm.ask("a", stream=True)
    assert last["choices"] == []
    assert vllm.engine.report(last).tokens_reused == 32
    sent = (await vllm.fake_stats())["last_body"]
    assert sent["stream_options"] == {"include_usage": True}


async def test_vllm_metrics_scrape_reflects_the_fake(vllm: Running) -> None:
    """Prefix-cache counters from /metrics match the answers; the sink re-exposes them."""
    answers = [await vllm.ask("a"), await vllm.ask("a")]
    load = await vllm.engine.scrape()
    prompt = sum(a["usage"]["prompt_tokens"] for a in answers)
    assert (load.prefix_cache_hits, load.prefix_cache_queries) == (32.0, prompt)
    assert (load.running, load.waiting) == (0, 0)
    registry = CollectorRegistry()
    assert vllm.engine.metrics_sink is not None
    registry.register(vllm.engine.metrics_sink)
    text = generate_latest(registry).decode()
    assert 'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 32.0' in text


async def test_vllm_metrics_show_running_and_waiting_requests() -> None:
    """With one slot, one request runs and one waits while both are in flight."""
    running = await _launch(slots=1, LATENCY_MS="1500")
    try:
        asks = [asyncio.create_task(running.ask(t)) for t in ("a", "b")]
        load = await running.engine.scrape()
        for _ in range(500):  # the requests reach the engine a moment after they are sent
            if (load.running, load.waiting) == (1, 1):
                break
            await asyncio.sleep(0.01)
            load = await running.engine.scrape()
        assert (load.running, load.waiting) == (1, 1)
        assert load.kv_cache_usage > 0
        await asyncio.gather(*asks)
    finally:
        running.engine.http.close()
        await running.engine.control.aclose()
        await running.process.stop(grace_s=5)


async def test_vllm_binary_is_found_on_path() -> None:
    """`vllm` as the binary name runs the first `vllm` on PATH (the fake's folder here)."""
    running = await _launch(binary="vllm")
    assert running.process.argv[0] == "vllm"
    assert running.process.state is EngineState.READY
    running.engine.http.close()
    await running.engine.control.aclose()
    await running.process.stop(grace_s=5)


async def test_vllm_sleep_and_wake_round_trip(vllm: Running) -> None:
    """Sleep frees the GPU memory and drops the cache; wake-up brings the memory back."""
    awake_mb = int((await vllm.fake_stats())["state"]["gpu_memory_used_mb"])
    await vllm.cached("a")
    slept = await vllm.engine.sleep(level=1)
    assert slept.standby is Standby.SLEEPING and slept.memory_mb is not None
    assert slept.memory_mb < awake_mb
    woke = await vllm.engine.wake_up()
    assert woke.standby is Standby.AWAKE and woke.memory_mb == awake_mb
    assert await vllm.cached("a") == 0  # level 1 drops the KV cache


async def test_vllm_out_of_memory_at_start_fails_with_vllms_message() -> None:
    """CUDA OOM while loading: EngineOutOfMemory saying so, exit code 1; vLLM's own words
    are in its log (the error's `log`), not in the message a tenant may read."""
    with pytest.raises(EngineOutOfMemory) as err:
        await _launch(MODE="oom_at_start")
    assert str(err.value).startswith("vLLM ran out of GPU memory while starting")
    assert "CUDA out of memory" not in str(err.value)
    assert any("CUDA out of memory" in line for line in err.value.log)
    assert err.value.exit_code == 1


async def test_vllm_too_little_free_memory_fails_as_out_of_memory() -> None:
    """A utilization above the free GPU memory fails as out of memory (vLLM's 'Free memory
    on device' in its log)."""
    with pytest.raises(EngineOutOfMemory) as err:
        await _launch(GPU_FREE_MB="1024")
    assert any("Free memory on device" in line for line in err.value.log)


async def test_vllm_context_above_the_models_fails_with_vllms_reason() -> None:
    """A maxContextLength above the model's: the start fails naming vLLM's error kind
    (pydantic's ValidationError, as the real 0.32.0 reports a refused config value); its
    words are in the error's `log`."""
    opts = _options(max_context_length=999_999)
    with pytest.raises(EngineStartFailed) as err:
        await launch(opts, salts=None, load_timeout_s=20, env=process_env())
    assert not isinstance(err.value, EngineOutOfMemory)
    assert str(err.value).startswith("vLLM failed to start (ValidationError)")
    assert any("User-specified max_model_len (999999)" in line for line in err.value.log)


async def test_vllm_slow_start_succeeds_within_the_timeout() -> None:
    """Connections refused for a while are a load in progress, not a failure."""
    running = await _launch(MODE="slow_start", START_S="1.5")
    assert running.process.state is EngineState.READY
    running.engine.http.close()
    await running.engine.control.aclose()
    await running.process.stop(grace_s=5)


async def test_vllm_start_timeout_is_a_start_failure() -> None:
    """An engine that loads for longer than the load timeout fails the start."""
    opts = _options()
    with pytest.raises(EngineStartFailed, match="did not become healthy"):
        await launch(
            opts,
            salts=None,
            load_timeout_s=1.0,
            env=process_env(MODE="slow_start", START_S="30"),
        )


def _with_control(handler: Any) -> VllmEngine:
    engine = _engine(CacheSalts(SECRET))
    engine.control = httpx.AsyncClient(
        base_url="http://engine", transport=httpx.MockTransport(handler)
    )
    return engine


async def test_vllm_model_flush_without_dev_mode_says_why() -> None:
    """vLLM without VLLM_SERVER_DEV_MODE answers 404: the flush answer says so."""
    engine = _with_control(lambda request: httpx.Response(404, json={"detail": "Not Found"}))
    result = await engine.flush(FlushScope("model", model_id="m"))
    assert not result.flushed
    assert result.reason is not None and "VLLM_SERVER_DEV_MODE" in result.reason


async def test_vllm_model_flush_reports_a_refused_reset() -> None:
    """`{"success": false}` (blocks still held) is a flush that did not happen."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"success": False})

    result = await _with_control(handler).flush(FlushScope("all"))
    assert not result.flushed
    assert seen[0].url.params["reset_running_requests"] == "true"


async def test_vllm_shared_cache_cannot_flush_one_tenant() -> None:
    """Without salts a tenant flush is refused with the reason; a model flush still works."""
    result = await _engine(None).flush(FlushScope("tenant", tenant_id="a"))
    assert not result.flushed and result.reason is not None


async def test_vllm_sleep_that_does_not_take_is_an_error() -> None:
    """/sleep answered but /is_sleeping says awake: EngineControlFailed, still AWAKE."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/sleep":
            return httpx.Response(200, json={"status": "sleeping", "level": 1})
        return httpx.Response(200, json={"is_sleeping": False})

    engine = _with_control(handler)
    with pytest.raises(EngineControlFailed):
        await engine.sleep()
    assert engine.standby is Standby.AWAKE


# Lines of the real vLLM 0.32.0 CPU build's start-up log (scripts/install-vllm).
CPU_STARTUP = [
    "(Worker pid=29393) INFO 11-25 15:06:46 [cpu_worker.py:260] Explicitly set "
    "(1.0/11.84) GiB for KV cache on node 0.",
    "(EngineCore pid=28957) INFO 11-25 15:06:46 [kv_cache_utils.py:2327] CPU KV cache size: "
    "55,356 tokens, Maximum concurrency for 2,048 tokens per request: 27.03x",
]


def test_vllm_startup_log_on_the_cpu_gives_kv_size() -> None:
    """The CPU build's own lines give the KV cache's size, in tokens and in GiB."""
    engine = _engine()
    engine.read_startup_log(CPU_STARTUP)
    assert engine.kv_cache_tokens == 55356
    assert engine.kv_size_mb == 1024.0

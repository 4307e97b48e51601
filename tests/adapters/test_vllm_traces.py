"""Where a started vLLM sends its spans: the runner's collector, from OTEL_* (pure)."""

from __future__ import annotations

from typing import Any

from adapters.environment import engine_environment
from adapters.kind import OtlpTraces
from adapters.vllm.launch import (
    VLLM_ENVIRONMENT,
    VllmLaunchOptions,
    command_line,
    engine_env,
    launch_options,
)
from runner.floor.otlp import engine_traces

HTTP = OtlpTraces("http://collector:4318/v1/traces", "http/protobuf", "vllm")
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _options(**changes: Any) -> VllmLaunchOptions:
    params: dict[str, Any] = {
        "binary": "vllm",
        "model": "org/model",
        "model_id": "m",
        "port": None,
        "uds": "/tmp/q/engine.sock",
        "api_key": "k" * 48,
        "slots": 4,
        "quantization": None,
        "max_context_length": None,
        "default_max_model_len": None,
        "gpu_memory_budget_mb": None,
        "gpu_total_mb": None,
        "default_gpu_memory_utilization": 0.5,
        "enable_prefix_caching": True,
        **changes,
    }
    return launch_options(**params)


def test_engine_traces_follow_the_runners_otlp_settings() -> None:
    """The runner's endpoint with `/v1/traces` over HTTP (vLLM hands it to the exporter as
    is), as it is over gRPC or when the traces' own endpoint is set; nothing when the
    runner makes no spans, exports them to the console only, or ENGINE_TRACES is off."""
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}
    assert engine_traces(base) == HTTP
    grpc = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    assert engine_traces(grpc) == OtlpTraces("http://c:4317", "grpc", "vllm")
    own = {**base, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4318/x"}
    assert engine_traces(own) == OtlpTraces("http://t:4318/x", "http/protobuf", "vllm")
    default = engine_traces({"OTEL_TRACES_EXPORTER": "otlp,console"})
    assert default == OtlpTraces("http://localhost:4318/v1/traces", "http/protobuf", "vllm")
    assert engine_traces({}) is None
    assert engine_traces({"OTEL_TRACES_EXPORTER": "console"}) is None
    assert engine_traces({**base, "OTEL_SDK_DISABLED": "true"}) is None
    assert engine_traces(base, enabled=False) is None


def test_vllm_started_with_the_collector_its_protocol_and_the_loads_trace() -> None:
    """Tracing on: `--otlp-traces-endpoint`, the protocol and vLLM's own service name in its
    environment, and the load's `traceparent`; off: none of them."""
    opts = _options(otlp_traces=HTTP, traceparent=PARENT)
    argv = command_line(opts)
    assert argv[argv.index("--otlp-traces-endpoint") + 1] == HTTP.endpoint
    env = engine_env(opts)
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert env["OTEL_SERVICE_NAME"] == "vllm"
    assert env["traceparent"] == PARENT
    off = _options(traceparent=PARENT)
    assert "--otlp-traces-endpoint" not in command_line(off)
    assert not {"traceparent", "OTEL_SERVICE_NAME"} & set(engine_env(off))


def test_vllm_entry_args_naming_an_endpoint_or_no_stats_keep_it_off() -> None:
    """An entry whose `args` name `--otlp-traces-endpoint` keeps its own, alone; one with
    `--disable-log-stats` gets none (vLLM 0.32.0 would fail every finished request)."""
    args = ["--otlp-traces-endpoint=http://elsewhere:4317"]
    opts = _options(otlp_traces=HTTP, extra_args=args)
    argv = command_line(opts)
    assert HTTP.endpoint not in argv and argv[-1] == args[0]
    assert "OTEL_SERVICE_NAME" not in engine_env(opts)
    quiet = _options(otlp_traces=HTTP, traceparent=PARENT, extra_args=["--disable-log-stats"])
    assert "--otlp-traces-endpoint" not in command_line(quiet)
    assert quiet.traceparent is None and "traceparent" not in engine_env(quiet)


def test_vllm_environment_takes_the_exporters_settings_never_the_runners_secrets() -> None:
    """OTEL_* reach vLLM (the exporter's headers, the sampler); the service name is its own,
    and a secret's name stays out whatever its prefix."""
    runner = {
        "OTEL_EXPORTER_OTLP_HEADERS": "x-team=ml",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_SERVICE_NAME": "quorum-runner",
        "OTEL_SECRET_THING": "s",
        "WEBHOOK_SECRET": "w",
    }
    added = engine_env(_options(otlp_traces=HTTP))
    env = engine_environment(runner, VLLM_ENVIRONMENT, added)
    assert env["OTEL_EXPORTER_OTLP_HEADERS"] == "x-team=ml"
    assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert env["OTEL_SERVICE_NAME"] == "vllm"
    assert "OTEL_SECRET_THING" not in env and "WEBHOOK_SECRET" not in env

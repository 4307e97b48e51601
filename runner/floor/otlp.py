"""What the standard `OTEL_*` variables ask of the runner, read once (pure).

Read by the runner's own tracing (runner/telemetry/tracing.py: whether spans are made)
and by the engine settings (runner/engines/kinds.py: where an engine the runner starts
sends its own spans, so that they land beside the runner's, in the same collector).
"""

from __future__ import annotations

from collections.abc import Mapping

from adapters.kind import OtlpTraces

ENGINE_SERVICE = "vllm"
"""The service name a started vLLM's spans carry (`service.name`)."""
_DEFAULT_ENDPOINTS = {"http/protobuf": "http://localhost:4318", "grpc": "http://localhost:4317"}
"""The SDK's own defaults when no endpoint is set."""


def wanted(env: Mapping[str, str]) -> bool:
    """Whether `env` asks for traces.

    1. OTEL_SDK_DISABLED=true: no.
    2. OTEL_TRACES_EXPORTER set: yes unless it is `none`.
    3. An OTLP endpoint set (OTEL_EXPORTER_OTLP_ENDPOINT or _TRACES_ENDPOINT): yes.
    4. Otherwise no: the SDK's own default exporter (otlp to localhost) is not assumed.
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":  # 1
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:  # 2
        return exporters != "none"
    return bool(  # 3, 4
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def protocol(env: Mapping[str, str]) -> str:
    """OTLP's protocol: the traces' own, else OTLP's, else `http/protobuf` (the SDK's)."""
    return (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()


def engine_traces(env: Mapping[str, str], enabled: bool = True) -> OtlpTraces | None:
    """Where an engine the runner starts exports its spans: the runner's own collector.

    1. ENGINE_TRACES off (`enabled` False), or the runner makes no spans (`wanted`), or
       none of its exporters is OTLP (`console` alone): nowhere.
    2. The endpoint as the engine's exporter is handed it (vLLM passes it to the OTLP
       exporter's constructor, which, unlike the SDK reading its variables, adds no path):
       OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is; else OTEL_EXPORTER_OTLP_ENDPOINT, with
       `/v1/traces` after it over HTTP; else the SDK's default for the protocol.
    3. The protocol: the runner's (vLLM's own default is gRPC, the runner's HTTP).
    """
    exporters = env.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",")
    if not (enabled and wanted(env) and "otlp" in (e.strip() for e in exporters)):  # 1
        return None
    chosen = protocol(env)  # 3
    endpoint = (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or "").strip()  # 2
    if not endpoint:
        base = (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip()
        base = base or _DEFAULT_ENDPOINTS.get(chosen, _DEFAULT_ENDPOINTS["http/protobuf"])
        endpoint = base if chosen == "grpc" else base.rstrip("/") + "/v1/traces"
    return OtlpTraces(endpoint=endpoint, protocol=chosen, service_name=ENGINE_SERVICE)

"""Which OTEL_* settings turn tracing on, and which exporters they name (pure)."""

from __future__ import annotations

import pytest

from faults import ConfigError
from runner.floor.otlp import wanted
from runner.telemetry.tracing import exporter_names


def test_tracing_config_wanted_only_when_asked() -> None:
    """Off unless an exporter or an OTLP endpoint is named; OTEL_SDK_DISABLED wins."""
    assert not wanted({})
    assert not wanted({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"})
    assert wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert wanted({"OTEL_TRACES_EXPORTER": "console"})
    assert not wanted({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "x"})
    assert not wanted({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"})


def test_tracing_config_exporters_and_protocols() -> None:
    """otlp over http/protobuf by default or grpc; console; anything else refused."""
    assert exporter_names({}) == [("otlp", "http/protobuf")]
    grpc = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_TRACES_EXPORTER": "otlp,console"}
    assert exporter_names(grpc) == [("otlp", "grpc"), ("console", "")]
    traces_only = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    traces_only["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    assert exporter_names(traces_only) == [("otlp", "http/protobuf")]
    with pytest.raises(ConfigError):
        exporter_names({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ConfigError):
        exporter_names({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})

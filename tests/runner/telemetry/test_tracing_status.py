"""A span that an exception leaves names the exception's type, never its message
(runner/telemetry/tracing.py `span`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from runner.telemetry import tracing

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("test"))
    yield exporter
    provider.shutdown()


def test_span_error_status_names_the_type_not_the_message(
    exported: InMemorySpanExporter,
) -> None:
    """An exception's message (a path, an engine's words) stays out of the span's status
    and events; its type and the error status are there."""
    with pytest.raises(OSError), tracing.span("engine call"):
        raise OSError("/srv/op/weights/secret-model.bin: no such file")
    (finished,) = exported.get_finished_spans()
    assert finished.status.status_code is StatusCode.ERROR
    assert finished.status.description == "OSError"
    assert not finished.events
    assert "secret-model" not in repr(finished.to_json())


def test_span_without_an_exception_keeps_an_unset_status(
    exported: InMemorySpanExporter,
) -> None:
    """A block that ends normally leaves the status as it was set inside it."""
    with tracing.span("fine"):
        pass
    (finished,) = exported.get_finished_spans()
    assert finished.status.status_code is StatusCode.UNSET

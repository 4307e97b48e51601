"""OpenTelemetry traces: off unless the standard `OTEL_*` variables ask for them.

Configured once at start-up (`configure`, from `quorum serve`), through the OpenTelemetry
SDK: the exporter (`OTEL_TRACES_EXPORTER`: `otlp`, `console` or `none`), OTLP's protocol
(`OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`: `http/protobuf` or `grpc`) and endpoint, the
sampler (`OTEL_TRACES_SAMPLER`, `_ARG`), the service name and resource, the batch
processor's `OTEL_BSP_*`; the SDK reads those itself (docs/configuration.md, "Tracing").

Off (the default), nothing here creates an object per request: every helper checks one
module flag (`on()`) first and hands back a shared no-op. On, the helpers are the only
place the runner touches the OpenTelemetry API: spans (`span`, `within`), the context
carried into a request (`extract`) and out of it (`traceparent`, `inject`), and the ids
on log lines (`_with_trace_ids`). What a span may carry: routes, tenants, models,
statuses, refusal codes, priorities, token counts, times; never a prompt, a key, a token
or a signature (docs/operations.md, "Tracing").
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Awaitable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from faults import ConfigError
from runner.floor import otlp

SERVICE_NAME = "quorum-runner"
"""The service name when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES names one."""
PROTOCOLS = ("http/protobuf", "grpc")
EXPORTERS = ("otlp", "console", "none")

Attributes = Mapping[str, str | int | float | bool]
T = TypeVar("T")

_tracer: Tracer | None = None
ON = False
"""Whether spans are made: the hot path reads this flag (`on()` elsewhere)."""
_propagator = TraceContextTextMapPropagator()
_NO_SPAN = trace.INVALID_SPAN
CLIENT = SpanKind.CLIENT
SERVER = SpanKind.SERVER


def on() -> bool:
    """Whether spans are made (`configure` found the variables asking for them)."""
    return _tracer is not None


def exporter_names(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """The exporters `env` names, each with its protocol (`""` but for otlp); a name or a
    protocol this runner does not ship is a configuration error (exit 2 at start)."""
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    protocol = otlp.protocol(env)
    chosen: list[tuple[str, str]] = []
    for name in filter(None, names):
        if name not in EXPORTERS:
            raise ConfigError(f"OTEL_TRACES_EXPORTER: {name!r} is not one of {EXPORTERS}")
        if name == "otlp" and protocol not in PROTOCOLS:
            raise ConfigError(f"OTLP protocol {protocol!r} is not one of {PROTOCOLS}")
        if name != "none":
            chosen.append((name, protocol if name == "otlp" else ""))
    return chosen


def configure(env: Mapping[str, str] | None = None) -> bool:
    """Set up the SDK's tracer provider when `env` (default: the process environment)
    asks for traces; True when it did. Spans are exported in batches from a thread; the
    provider flushes them when the process exits."""
    global _tracer, ON
    env = os.environ if env is None else env
    if not otlp.wanted(env):
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER
    for name, protocol in exporter_names(env):
        provider.add_span_processor(BatchSpanProcessor(_exporter(name, protocol)))
    trace.set_tracer_provider(provider)
    _tracer = provider.get_tracer("quorum.runner")
    ON = True
    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(lambda *a, **k: _with_trace_ids(factory(*a, **k)))
    return True


def _exporter(name: str, protocol: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter()


def _with_trace_ids(record: logging.LogRecord) -> logging.LogRecord:
    """A log record made inside a sampled span carries its `trace_id` and `span_id`."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        record.trace_id = format(ctx.trace_id, "032x")
        record.span_id = format(ctx.span_id, "016x")
    return record


# -- spans -------------------------------------------------------------------------------


def extract(headers: Iterable[tuple[bytes, bytes]]) -> otel_context.Context | None:
    """The caller's trace context from an ASGI request's `traceparent` and `tracestate`
    (None: a new trace begins)."""
    carrier = {}
    for name, value in headers:
        if name == b"traceparent" or name == b"tracestate":
            carrier[name.decode()] = value.decode("latin-1")
    if "traceparent" not in carrier:
        return None
    return _propagator.extract(carrier)


@contextlib.contextmanager
def span(
    name: str,
    attributes: Attributes | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    parent: otel_context.Context | None = None,
) -> Iterator[Span]:
    """A span current for the block (the invalid, no-op span when tracing is off); an
    exception leaving the block sets its status to error with the exception's type only:
    its message may hold a path, an engine's words or a tenant's input, and a trace
    backend is read by more people than the runner's logs (the SDK's default copies it)."""
    if _tracer is None:
        yield _NO_SPAN
        return
    with _tracer.start_as_current_span(
        name,
        context=parent,
        kind=kind,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            current.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise


async def within(work: Awaitable[T], name: str, attributes: Attributes | None = None) -> T:
    """`work` awaited inside a span of its own (a background task: a load, a job)."""
    with span(name, attributes):
        return await work


def current() -> Span:
    return trace.get_current_span()


def annotate(attributes: Attributes) -> None:
    """Set `attributes` on the current span (nothing when tracing is off)."""
    if _tracer is not None:
        trace.get_current_span().set_attributes(attributes)


def event(name: str, attributes: Attributes | None = None) -> None:
    """An event on the current span: a stage reached, with its figures."""
    if _tracer is not None:
        trace.get_current_span().add_event(name, attributes)


def sampled_ids() -> tuple[str, str] | None:
    """The current span's trace id and span id (hex) when it is sampled, else None."""
    if _tracer is None:
        return None
    ctx = trace.get_current_span().get_span_context()
    if not (ctx.is_valid and ctx.trace_flags.sampled):
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def failed(target: Span, error_type: str) -> None:
    """`target` ended in error: `error.type` (a refusal's code) and an error status."""
    target.set_attribute("error.type", error_type)
    target.set_status(Status(StatusCode.ERROR))


# -- context out -------------------------------------------------------------------------


def traceparent() -> bytes:
    """The current span's context as header lines for an engine request (`traceparent`
    and, when the caller sent one, `tracestate`); empty when off or outside a span."""
    if _tracer is None:
        return b""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in carrier.items())


def inject(headers: dict[str, str]) -> None:
    """Add the current span's `traceparent` (and `tracestate`) to `headers`."""
    if _tracer is not None:
        _propagator.inject(headers)

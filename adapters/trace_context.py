"""The runner's current trace context, for engines reached by something other than an
HTTP header the runner's tracing adds itself (runner/telemetry/tracing.py): a process's
environment (vLLM's start-up spans), a prompt's `extra_data` (ComfyUI), a job message
(the speech worker, whose caller passes it).

Through the OpenTelemetry API only: with no SDK configured (tracing off) the current span
is the invalid one and nothing is handed on.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_propagator = TraceContextTextMapPropagator()


def current_traceparent() -> str | None:
    """The current span's W3C `traceparent`; None outside a span (or tracing off)."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def annotate(name: str, value: str) -> None:
    """Set one attribute on the current span (a no-op when it is not recording)."""
    trace.get_current_span().set_attribute(name, value)

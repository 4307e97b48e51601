"""The real vLLM (PyPI's CPU build, scripts/install-vllm) joins the runner's traces.

The runner traces to a real OTLP receiver (OTLP/HTTP); a vLLM it starts is given the
same collector (`--otlp-traces-endpoint`, the protocol, its own service name) and the
load's trace for its start-up spans; a chat's engine call hands vLLM `traceparent`, and
vLLM's `llm_request` span is the engine call's child (adapters/vllm/launch.py,
docs/engines.md "vLLM's traces").
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import httpx
import pytest

from tests.support.otlp_receiver import OtlpReceiver, Received, otlp_receiver
from tests.support.real_vllm import DEFAULT_ID, START_TIMEOUT_S, default_entry, models_file
from tests.support.runner_proc import RunnerProcess, start_runner
from tests.support.tokens import DEV_REGISTRY, dev_token

pytestmark = pytest.mark.timeout(900)


@dataclass
class Traced:
    receiver: OtlpReceiver
    runner: RunnerProcess


@pytest.fixture(scope="module")
def traced(real_vllm: None) -> Iterator[Traced]:
    with ExitStack() as stack:
        receiver = stack.enter_context(otlp_receiver())
        env = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": "quorum-test",
            "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: the spans leave at once
            "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
            "QUEUE_TIMEOUT_MS": "240000",
            "RUNNER_MEMORY_MB": "16384",
        }
        models = models_file(default_entry(preload=False, parallel=2))
        runner = stack.enter_context(start_runner(models_file=models, env=env))
        yield Traced(receiver, runner)


def new_trace() -> tuple[str, str, dict[str, str]]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, {"traceparent": f"00-{trace_id}-{span_id}-01"}


def spans_named(
    receiver: OtlpReceiver, trace_id: str, timeout: float, *names: str
) -> dict[str, Received]:
    """Wait until the trace has a span of each name; those spans by name."""

    def found(r: OtlpReceiver) -> dict[str, Received] | None:
        spans = {s.name: s for s in r.in_trace(trace_id)}
        return {n: spans[n] for n in names} if all(n in spans for n in names) else None

    result: dict[str, Received] = receiver.wait_for(found, timeout, f"{names} in {trace_id}")
    return result


def test_tracing_real_vllm_spans_join_the_runners_trace(traced: Traced) -> None:
    """A governed load of the real vLLM under a caller's trace: vLLM's start-up spans join
    it (service `vllm`, "Overall Loading" the load's child); then a chat under another:
    vLLM's `llm_request` (its queue time, tokens) is the child of the runner's engine-call
    span, in the caller's trace, and carries no prompt."""
    load_trace, _, header = new_trace()
    token = dev_token("model-load", DEFAULT_ID, {})
    body = {"modelId": DEFAULT_ID, "verifiedOpToken": token}
    url = traced.runner.url
    r = httpx.post(url + "/v1/models/load", json=body, headers=header, timeout=30)
    assert r.status_code == 202, r.text
    (load,) = spans_named(traced.receiver, load_trace, START_TIMEOUT_S, "model load").values()
    assert load.attributes["quorum.task.status"] == "completed", load
    started = {s.name: s for s in traced.receiver.in_trace(load_trace) if s.service == "vllm"}
    seen = [(s.name, s.service, s.parent_id) for s in traced.receiver.in_trace(load_trace)]
    assert "Overall Loading" in started, seen
    assert started["Overall Loading"].parent_id == load.span_id, seen

    trace_id, parent, header = new_trace()
    chat = {
        "model": DEFAULT_ID,
        "messages": [{"role": "user", "content": "a secret prompt: say hi"}],
        "max_tokens": 8,
    }
    r = httpx.post(
        url + "/v1/chat/completions",
        json=chat,
        headers={"X-Tenant-ID": "acme", **header},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    got = spans_named(
        traced.receiver,
        trace_id,
        60,
        "POST /v1/chat/completions",
        f"chat {DEFAULT_ID}",
        "llm_request",
    )
    server, engine, vllm = got.values()
    assert server.parent_id == parent and server.service == "quorum-test"
    assert engine.parent_id == server.span_id and engine.kind == "client"
    assert vllm.service == "vllm" and vllm.kind == "server"
    assert vllm.parent_id == engine.span_id
    assert vllm.attributes["gen_ai.usage.prompt_tokens"] > 0
    assert vllm.attributes["gen_ai.usage.completion_tokens"] > 0
    assert "gen_ai.latency.time_in_queue" in vllm.attributes
    everything = str([s.attributes for s in traced.receiver.in_trace(trace_id)])
    assert "a secret prompt" not in everything

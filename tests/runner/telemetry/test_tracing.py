"""OpenTelemetry traces end to end: a real runner exporting to a real OTLP receiver.

The caller starts a W3C trace (`traceparent`); the runner's spans (server, admission,
engine call, governance, load task, job, webhook) join it, the fake engine and the
webhook receiver get it in `traceparent`, and the runner's log lines carry its ids
(runner/telemetry/tracing.py, docs/operations.md "Tracing").
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)

from tests.deploy.tools import promtool
from tests.fixtures.launch import FakeEngine, start_fake
from tests.support.engines import CHECKPOINT, GOVERNED, comfyui_root
from tests.support.otlp_receiver import OtlpReceiver, Received, otlp_receiver
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, fixture_bin, start_runner
from tests.support.tokens import dev_token

pytestmark = pytest.mark.timeout(120)

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # a test signing secret
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "a secret prompt"}]}


def otel_env(receiver: OtlpReceiver, protocol: str = "http/protobuf") -> dict[str, str]:
    endpoint = receiver.url if protocol != "grpc" else f"http://127.0.0.1:{receiver.grpc_port}"
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_SERVICE_NAME": "quorum-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: the spans leave at once
    }


def new_trace() -> tuple[str, str, dict[str, str]]:
    """A caller's trace id, its span id, and the header that carries them."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, {"traceparent": f"00-{trace_id}-{span_id}-01"}


def named(spans: list[Received], name: str) -> Received | None:
    return next((s for s in spans if s.name == name), None)


def spans_named(receiver: OtlpReceiver, trace_id: str, *names: str) -> dict[str, Received]:
    """Wait until the trace has a span of each name; those spans by name."""

    def found(r: OtlpReceiver) -> dict[str, Received] | None:
        spans = r.in_trace(trace_id)
        got = {name: named(spans, name) for name in names}
        return {k: v for k, v in got.items() if v is not None} if all(got.values()) else None

    result: dict[str, Received] = receiver.wait_for(found, 30, f"{names} in {trace_id}")
    return result


@dataclass
class Traced:
    receiver: OtlpReceiver
    runner: RunnerProcess
    echo: FakeEngine

    def chat(self, body: dict[str, Any], **headers: str) -> httpx.Response:
        return httpx.post(
            self.runner.url + "/v1/chat/completions",
            json=body,
            headers={"X-Tenant-ID": "acme", **headers},
            timeout=30,
        )


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    tmp = tmp_path_factory.mktemp("traced")
    tenants = tmp / "tenants.yaml"
    tenants.write_text(
        "tenants:\n  acme:\n    models: [echo]\n"
        "  frugal:\n    models: [echo]\n    token_budgets: [{tokens: 100000, per: hour}]\n"
        "  tiny:\n    models: [echo]\n    token_budgets: [{tokens: 10, per: hour}]\n"
    )
    with ExitStack() as stack:
        receiver = stack.enter_context(otlp_receiver())
        echo = stack.enter_context(
            start_fake("fake_openai", "--latency-ms", "0", "--chunk-delay-ms", "1", "--chunks", "4")
        )
        models = (
            "models:\n"
            f"  - {{id: echo, backend: openai, url: '{echo.url}'}}\n"
            f"  - {{id: other, backend: openai, url: '{echo.url}'}}\n"
            f"  - {{id: lazy, backend: llama-server, path: /dev/null,"
            f" bin: '{fixture_bin('llama-server-ok')}', vram_mb: 64}}\n"
        )
        env = {**otel_env(receiver), **GOVERNED, "TENANTS_FILE": str(tenants)}
        runner = stack.enter_context(start_runner(models_file=models, env=env))
        yield Traced(receiver, runner, echo)


def test_tracing_chat_joins_the_callers_trace_and_hands_it_to_the_engine(traced: Traced) -> None:
    """A chat carrying `traceparent`: the server span is the caller's child (tenant, model,
    status), admission and the engine call its children, and the engine receives the
    engine call's context; no prompt in any attribute."""
    trace_id, parent, header = new_trace()
    r = traced.chat(CHAT, **header)
    assert r.status_code == 200, r.text
    got = spans_named(
        traced.receiver, trace_id, "POST /v1/chat/completions", "admission", "chat echo"
    )
    server, admission, engine = got.values()
    assert server.parent_id == parent and server.kind == "server"
    assert server.service == "quorum-test"
    attrs = server.attributes
    assert attrs["http.route"] == "/v1/chat/completions"
    assert attrs["http.response.status_code"] == 200 and attrs["quorum.tenant"] == "acme"
    assert attrs["gen_ai.request.model"] == "echo"
    assert attrs["quorum.request.id"] == r.headers["x-request-id"]
    assert admission.parent_id == server.span_id
    assert admission.attributes["quorum.admission.outcome"] == "granted"
    assert admission.attributes["quorum.priority"] == "normal"
    assert "quorum.queue.wait_ms" in admission.attributes
    assert engine.parent_id == server.span_id and engine.kind == "client"
    assert engine.attributes["gen_ai.operation.name"] == "chat"
    assert engine.attributes["gen_ai.usage.output_tokens"] > 0
    sent = traced.echo.stats()["last_headers"]
    assert sent["traceparent"].split("-")[1:3] == [trace_id, engine.span_id]
    everything = str([s.attributes for s in traced.receiver.in_trace(trace_id)])
    assert "a secret prompt" not in everything


def test_tracing_stream_has_the_time_to_first_token(traced: Traced) -> None:
    """A streamed chat: the engine call's span has the time to the first token and the
    tokens the final chunk reported."""
    trace_id, _, header = new_trace()
    r = traced.chat({**CHAT, "stream": True, "stream_options": {"include_usage": True}}, **header)
    assert r.status_code == 200 and "data:" in r.text
    got = spans_named(traced.receiver, trace_id, "POST /v1/chat/completions", "chat echo")
    engine = got["chat echo"]
    assert engine.attributes["quorum.streamed"] is True
    assert engine.attributes["gen_ai.server.time_to_first_token"] > 0
    assert engine.attributes["gen_ai.usage.output_tokens"] > 0
    assert traced.echo.stats()["last_headers"]["traceparent"].split("-")[1] == trace_id


def test_tracing_refusal_names_its_code_and_reaches_no_engine(traced: Traced) -> None:
    """A model the tenant may not use: the server span says 403 and `model_not_allowed`;
    no admission, no engine call."""
    trace_id, parent, header = new_trace()
    r = traced.chat({**CHAT, "model": "other"}, **header)
    assert r.status_code == 403
    (server,) = spans_named(traced.receiver, trace_id, "POST /v1/chat/completions").values()
    assert server.parent_id == parent
    assert server.attributes["http.response.status_code"] == 403
    assert server.attributes["error.type"] == "model_not_allowed"
    names = {s.name for s in traced.receiver.in_trace(trace_id)}
    assert names == {"POST /v1/chat/completions"}


def test_tracing_budget_reserved_and_settled(traced: Traced) -> None:
    """A tenant with a token budget: the reservation is a span under the server span
    (tenant, bounds, budgets charged, tokens left, `reserved`), the settlement an event on
    the server span (reserved and charged tokens, `settled`); no prompt in either."""
    trace_id, _, header = new_trace()
    r = traced.chat(CHAT, **{**header, "X-Tenant-ID": "frugal"})
    assert r.status_code == 200, r.text
    got = spans_named(
        traced.receiver, trace_id, "POST /v1/chat/completions", "token budget reserve"
    )
    server, reserve = got.values()
    assert reserve.parent_id == server.span_id
    attrs = reserve.attributes
    assert attrs["quorum.tenant"] == "frugal" and attrs["gen_ai.request.model"] == "echo"
    assert attrs["quorum.budget.outcome"] == "reserved" and attrs["quorum.budget.budgets"] == 1
    reserved = attrs["quorum.budget.tokens_reserved"]
    assert reserved == attrs["quorum.budget.input_bound"] + attrs["quorum.budget.output_bound"]
    assert attrs["quorum.budget.remaining"] == int(r.headers["x-ratelimit-remaining-tokens"])
    settled = server.event("token budget settled")
    assert settled is not None, server.events
    assert settled["quorum.tenant"] == "frugal" and settled["quorum.budget.outcome"] == "settled"
    assert settled["quorum.budget.tokens_reserved"] == reserved
    usage = r.json()["usage"]
    assert settled["quorum.budget.input_tokens"] == usage["prompt_tokens"]
    assert settled["quorum.budget.tokens_settled"] == usage["total_tokens"]
    everything = str([(s.attributes, s.event_attributes) for s in [server, reserve]])
    assert "a secret prompt" not in everything


def test_tracing_budget_refusal_names_its_code(traced: Traced) -> None:
    """A request larger than the tenant's whole budget: the reservation's span says
    `request_exceeds_budget` (an error), the server span 400; nothing settled, no engine."""
    trace_id, _, header = new_trace()
    r = traced.chat(CHAT, **{**header, "X-Tenant-ID": "tiny"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "request_exceeds_budget"
    got = spans_named(
        traced.receiver, trace_id, "POST /v1/chat/completions", "token budget reserve"
    )
    server, reserve = got.values()
    assert reserve.attributes["quorum.budget.outcome"] == "request_exceeds_budget"
    assert reserve.attributes["error.type"] == "request_exceeds_budget" and reserve.error
    assert server.event("token budget settled") is None
    names = {s.name for s in traced.receiver.in_trace(trace_id)}
    assert names == {"POST /v1/chat/completions", "token budget reserve"}


def test_tracing_new_trace_when_the_caller_sends_none(traced: Traced) -> None:
    """Without `traceparent` the runner starts a trace; the engine gets it all the same."""
    r = traced.chat(CHAT)
    assert r.status_code == 200
    request_id = r.headers["x-request-id"]

    def server(rec: OtlpReceiver) -> Received | None:
        return next(
            (s for s in rec.spans if s.attributes.get("quorum.request.id") == request_id), None
        )

    span: Received = traced.receiver.wait_for(server, 30, "the server span")
    assert span.parent_id == ""
    assert traced.echo.stats()["last_headers"]["traceparent"].split("-")[1] == span.trace_id


def test_tracing_governed_load_shows_approval_and_stages(traced: Traced) -> None:
    """A governed load under the caller's trace: the approval's span (no token in it) and
    the load task's span with its stages as events, to `completed`."""
    trace_id, _, header = new_trace()
    token = dev_token("model-load", "lazy", {})
    body = {"modelId": "lazy", "verifiedOpToken": token}
    r = httpx.post(traced.runner.url + "/v1/models/load", json=body, headers=header, timeout=30)
    assert r.status_code == 202, r.text
    got = spans_named(
        traced.receiver, trace_id, "POST /v1/models/load", "governance approval", "model load"
    )
    server, approval, load = got.values()
    assert server.attributes["http.route"] == "/v1/models/load"
    assert approval.parent_id == server.span_id
    assert approval.attributes["quorum.operation"] == "model-load"
    assert load.parent_id == server.span_id
    assert load.attributes["gen_ai.request.model"] == "lazy"
    assert load.attributes["quorum.task.id"] == r.json()["taskId"]
    assert load.attributes["quorum.task.status"] == "completed"
    assert "loading" in load.events and load.events[-1] == "completed"
    signed = json.dumps(token)
    for span in traced.receiver.in_trace(trace_id):
        for value in span.attributes.values():
            assert not (isinstance(value, str) and len(value) > 12 and value in signed), value


def test_tracing_async_job_and_webhook_over_grpc(tmp_path: Path) -> None:
    """OTLP over gRPC: an image job (fake ComfyUI) submitted under the caller's trace runs
    in a span of its own, its webhook delivery too, and the receiver gets `traceparent`;
    the runner's log line of the request carries the trace id."""
    folder = comfyui_root(tmp_path / "ComfyUI")
    with ExitStack() as stack:
        receiver = stack.enter_context(otlp_receiver(grpc=True))
        comfy = stack.enter_context(start_fake("fake_comfyui", "--base-directory", str(folder)))
        entry = f"{{id: sd, backend: comfyui, url: '{comfy.url}', checkpoint: {CHECKPOINT}}}"
        models = f"models:\n  - {entry}\n"
        env = {
            **otel_env(receiver, "grpc"),
            "COMFYUI_PATH": str(folder),
            "IMAGES_DIR": str(tmp_path / "images"),
            "WEBHOOK_SECRET": SECRET,
            "WEBHOOK_ALLOW_HOSTS": "127.0.0.1/32",
        }
        runner = stack.enter_context(start_runner(models_file=models, env=env, ready_timeout=60))
        trace_id, parent, header = new_trace()
        body = {"model": "sd", "prompt": "a kite", "size": "64x64"}
        body["webhook"] = receiver.url + "/hook"
        r = httpx.post(
            runner.url + "/v1/images/generations",
            json=body,
            headers={"X-Tenant-ID": "jobs", "Prefer": "respond-async", **header},
            timeout=30,
        )
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        got = spans_named(
            receiver,
            trace_id,
            "POST /v1/images/generations",
            "job image_generation",
            "POST webhook",
        )
        server, job, hook = got.values()
        assert server.parent_id == parent
        assert job.parent_id == server.span_id
        assert job.attributes["quorum.job.id"] == job_id
        assert job.attributes["quorum.job.status"] == "succeeded"
        assert hook.parent_id == job.span_id and hook.kind == "client"
        assert hook.attributes["http.response.status_code"] == 204
        (delivery,) = eventually(lambda: list(receiver.hooks), 10, "the webhook")
        assert delivery["traceparent"].split("-")[1:3] == [trace_id, hook.span_id]
        accepted = [line for line in runner.log().splitlines() if f"job {job_id} accepted" in line]
        assert accepted and f"trace_id={trace_id}" in accepted[0], accepted


def test_tracing_image_prompt_carries_the_trace_to_comfyui(tmp_path: Path) -> None:
    """A synchronous image generation under the caller's trace: ComfyUI (the fake) gets
    the runner's `traceparent` in the prompt's `extra_data` (it has no tracing; an
    operator finds it in its queue and history), and the server span names the prompt."""
    folder = comfyui_root(tmp_path / "ComfyUI")
    with ExitStack() as stack:
        receiver = stack.enter_context(otlp_receiver())
        comfy = stack.enter_context(start_fake("fake_comfyui", "--base-directory", str(folder)))
        entry = f"{{id: sd, backend: comfyui, url: '{comfy.url}', checkpoint: {CHECKPOINT}}}"
        env = {**otel_env(receiver), "COMFYUI_PATH": str(folder)}
        models = f"models:\n  - {entry}\n"
        runner = stack.enter_context(start_runner(models_file=models, env=env, ready_timeout=60))
        trace_id, parent, header = new_trace()
        body = {"model": "sd", "prompt": "a kite", "size": "64x64"}
        r = httpx.post(
            runner.url + "/v1/images/generations",
            json=body,
            headers={"X-Tenant-ID": "acme", **header},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        (server,) = spans_named(receiver, trace_id, "POST /v1/images/generations").values()
        assert server.parent_id == parent
        prompts = [e["body"] for e in comfy.stats()["recent"] if e["path"] == "/prompt"]
        sent = prompts[-1]  # the generation's (the start's own check came first)
        assert sent["extra_data"]["traceparent"].split("-")[1:3] == [trace_id, server.span_id]
        assert server.attributes["quorum.comfyui.prompt_id"] == sent["prompt_id"]


def test_tracing_off_without_the_variables() -> None:
    """No OTEL_* variables: the engine gets no `traceparent`, even when the caller sent one."""
    env = {k: "" for k in os.environ if k.startswith("OTEL_")}
    with (
        start_fake("fake_openai", "--latency-ms", "0") as echo,
        start_runner({"echo": echo.url}, env=env) as runner,
    ):
        _, _, header = new_trace()
        r = httpx.post(runner.url + "/v1/chat/completions", json=CHAT, headers=header, timeout=30)
        assert r.status_code == 200
        assert "traceparent" not in {k.lower() for k in echo.stats()["last_headers"]}


def test_tracing_exemplars_on_openmetrics_only(traced: Traced) -> None:
    """A traced request's duration is its bucket's exemplar on `/metrics` served as
    OpenMetrics (`Accept`, parsed by a strict OpenMetrics parser); the classic text format
    stays as it was, promtool clean."""
    trace_id, _, header = new_trace()
    assert traced.chat(CHAT, **header).status_code == 200
    url = traced.runner.url + "/metrics"
    accept = {"Accept": "application/openmetrics-text; version=1.0.0, text/plain;q=0.5"}
    r = httpx.get(url, headers=accept, timeout=10)
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    families = {f.name: f for f in openmetrics_families(r.text)}
    exemplars = [
        s.exemplar.labels
        for s in families["quorum_inference_duration_seconds"].samples
        if s.exemplar is not None and s.labels.get("model") == "echo"
    ]
    assert any(e["trace_id"] == trace_id for e in exemplars), exemplars
    classic = httpx.get(url, timeout=10)
    assert classic.headers["content-type"].startswith("text/plain")
    assert "trace_id" not in classic.text
    checked = promtool("check", "metrics", stdin=classic.text)
    assert checked.returncode == 0 and not (checked.stdout + checked.stderr).strip(), checked

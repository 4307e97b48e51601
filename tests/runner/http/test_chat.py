"""The data path end to end: a real runner subprocess in front of real fake-engine subprocesses."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import orjson
import pytest

from tests.fixtures.launch import FakeEngine, start_fake
from tests.support.runner_proc import RunnerProcess, start_runner

RESPONSE_HEADERS = (
    "x-cache-hit",
    "x-cache-tokens-reused",
    "x-queue-wait-ms",
    "x-gpu-time-ms",
    "x-request-id",
)
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hello runner"}]}


class Fleet:
    def __init__(self, runner: RunnerProcess, engines: dict[str, FakeEngine]) -> None:
        self.runner = runner
        self.engines = engines
        self.client = httpx.Client(base_url=runner.url, timeout=20)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with ExitStack() as stack:
        engines = {
            "echo": stack.enter_context(
                start_fake(
                    "fake_openai",
                    "--latency-ms",
                    "0",
                    "--chunk-delay-ms",
                    "1",
                    "--chunks",
                    "5",
                    "--cache-n",
                    "4",
                )
            ),
            "down": stack.enter_context(start_fake("fake_refuses")),
            "dies": stack.enter_context(
                start_fake(
                    "fake_dies_midstream", "--after", "2", "--how", "abort", "--chunk-delay-ms", "0"
                )
            ),
            "garbage": stack.enter_context(start_fake("fake_invalid_json")),
            "hangs": stack.enter_context(start_fake("fake_hangs")),
        }
        runner = stack.enter_context(
            start_runner(
                {name: e.url for name, e in engines.items()},
                # ENGINE_STATS_INTERVAL_S: the attached watch would soon turn "down" and
                # "hangs" failed (test_watch_attached.py); here the engine client is tested.
                # `metered` is declared (an env limit): tenant labels are the declared
                # tenants', any other id reads `_other` (docs/tenants.md).
                env={
                    "ENGINE_READ_TIMEOUT_S": "1",
                    "MAX_BODY_BYTES": "65536",
                    "ENGINE_STATS_INTERVAL_S": "3600",
                    "TENANT_RATE_LIMIT_metered": "unlimited",
                },
            )
        )
        fleet = Fleet(runner, engines)
        yield fleet
        fleet.client.close()


def _sse_events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e.strip()]


def test_chat_returns_engine_answer_with_all_headers(fleet: Fleet) -> None:
    """A chat completion through the runner is the engine's answer plus the five headers."""
    r = fleet.client.post("/v1/chat/completions", json=CHAT, headers={"X-Tenant-ID": "acme"})
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "echo: hello runner"
    for name in RESPONSE_HEADERS:
        assert name in r.headers, name
    assert r.headers["x-cache-hit"] == "true"
    assert int(r.headers["x-cache-tokens-reused"]) > 0


def test_stream_arrives_in_engine_chunks(fleet: Fleet) -> None:
    """A streamed answer has the same SSE events, in order, as the engine sends directly."""
    body = {**CHAT, "stream": True}
    direct = httpx.post(fleet.engines["echo"].url + "/v1/chat/completions", json=body).content
    with fleet.client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert all(name in r.headers for name in RESPONSE_HEADERS)
        chunks = list(r.iter_raw())
    through = b"".join(chunks)

    def contents(raw: bytes) -> list[object]:
        out: list[object] = []
        for event in _sse_events(raw):
            data = event.removeprefix(b"data: ")
            out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data)["choices"])
        return out

    assert contents(through) == contents(direct)
    assert len(_sse_events(through)) >= 7  # role + 5 tokens + final + [DONE]


def test_stream_chunks_are_not_merged(fleet: Fleet) -> None:
    """Each engine write reaches the client as its own chunk (no buffering in the runner)."""
    body = {**CHAT, "stream": True}
    with fleet.client.stream("POST", "/v1/chat/completions", json=body) as r:
        chunks = [c for c in r.iter_raw() if c]
    token_chunks = [c for c in chunks if b'"tok' in c]
    assert len(token_chunks) == 5
    assert all(c.count(b'"tok') == 1 for c in token_chunks)


def test_completions_and_embeddings_are_forwarded(fleet: Fleet) -> None:
    """/v1/completions and /v1/embeddings reach the engine and return its answer."""
    r = fleet.client.post("/v1/completions", json={"model": "echo", "prompt": "abc"})
    assert r.status_code == 200 and r.json()["object"] == "text_completion"
    r = fleet.client.post("/v1/embeddings", json={"model": "echo", "input": ["a", "b"]})
    assert r.status_code == 200 and len(r.json()["data"]) == 2


def test_extension_fields_are_not_forwarded(fleet: Fleet) -> None:
    """Body fields named x_* are removed before the engine sees the request."""
    r = fleet.client.post("/v1/chat/completions", json={**CHAT, "x_trace": "1", "x_cost": 3})
    assert r.status_code == 200
    last = fleet.engines["echo"].stats()["last_body"]
    assert "x_trace" not in last and "x_cost" not in last and last["model"] == "echo"


def test_models_lists_loaded_models(fleet: Fleet) -> None:
    """GET /v1/models lists every attached model in OpenAI's shape."""
    r = fleet.client.get("/v1/models")
    assert r.status_code == 200
    assert {m["id"] for m in r.json()["data"]} == {"echo", "down", "dies", "garbage", "hangs"}


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("X-Tenant-ID", "bad tenant!"),
        ("X-Tenant-ID", "x" * 65),
        ("X-Priority", "urgent"),
        ("X-Cache-Mode", "always"),
        ("X-Cache-Tag", "t" * 65),
    ],
)
def test_invalid_header_is_400_naming_it(fleet: Fleet, header: str, value: str) -> None:
    """Each invalid header value is refused with 400 and the header's name, before the engine."""
    before = fleet.engines["echo"].received("/v1/chat/completions")
    r = fleet.client.post("/v1/chat/completions", json=CHAT, headers={header: value})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_header"
    assert header in r.json()["error"]["message"]
    assert fleet.engines["echo"].received("/v1/chat/completions") == before


def test_unknown_model_is_404_listing_loaded(fleet: Fleet) -> None:
    """An unknown model is 404 and the message lists the loaded models."""
    r = fleet.client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"
    assert "echo" in r.json()["error"]["message"]


def test_oversized_body_is_413(fleet: Fleet) -> None:
    """A body above MAX_BODY_BYTES is 413 and never forwarded."""
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 70_000}]}
    r = fleet.client.post("/v1/chat/completions", json=big)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "payload_too_large"


@pytest.mark.parametrize("body", [b"not json", b"[1,2]", b'{"messages": []}', b'{"model": 3}'])
def test_bad_body_is_400(fleet: Fleet, body: bytes) -> None:
    """A body that is not a JSON object with a string model is 400."""
    r = fleet.client.post(
        "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_engine_down_is_502(fleet: Fleet) -> None:
    """An engine that refuses connections gives 502 with a clear message, headers included."""
    r = fleet.client.post("/v1/chat/completions", json={**CHAT, "model": "down"})
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "engine_unavailable"
    assert "down" in r.json()["error"]["message"]
    assert all(name in r.headers for name in RESPONSE_HEADERS)


def test_engine_invalid_json_is_502(fleet: Fleet) -> None:
    """An engine answering 200 with a body that is not JSON gives 502, not a broken 200."""
    r = fleet.client.post("/v1/chat/completions", json={**CHAT, "model": "garbage"})
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "engine_bad_response"


def test_engine_hang_is_504_not_a_hang(fleet: Fleet) -> None:
    """An engine that never answers gives 504 after ENGINE_READ_TIMEOUT_S."""
    r = fleet.client.post("/v1/chat/completions", json={**CHAT, "model": "hangs"})
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "engine_timeout"


def test_engine_dies_midstream_ends_stream_with_error_event(fleet: Fleet) -> None:
    """A stream cut by the engine ends with an SSE error event; the runner keeps serving."""
    body = {**CHAT, "model": "dies", "stream": True}
    with fleet.client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        raw = b"".join(r.iter_raw())
    events = _sse_events(raw)
    last = orjson.loads(events[-1].removeprefix(b"data: "))
    assert last["error"]["code"] == "engine_unavailable"
    assert sum(1 for e in events if b'"tok' in e) == 2
    ok = fleet.client.post("/v1/chat/completions", json=CHAT)
    assert ok.status_code == 200


def test_engine_dies_non_stream_is_502(fleet: Fleet) -> None:
    """A non-streamed request whose engine drops the connection gives 502."""
    r = fleet.client.post("/v1/chat/completions", json={**CHAT, "model": "dies"})
    assert r.status_code == 502


def test_metrics_count_requests_by_tenant_and_status(fleet: Fleet) -> None:
    """/metrics counts the requests just made, labelled by tenant and status."""
    for _ in range(3):
        fleet.client.post("/v1/chat/completions", json=CHAT, headers={"X-Tenant-ID": "metered"})
    fleet.client.post(
        "/v1/chat/completions", json={**CHAT, "model": "nope"}, headers={"X-Tenant-ID": "metered"}
    )
    text = fleet.client.get("/metrics").text
    assert 'quorum_requests_total{model="echo",status="200",tenant="metered"} 3.0' in text
    assert 'quorum_requests_total{model="_unknown",status="404",tenant="metered"} 1.0' in text
    assert "quorum_inference_duration_seconds_bucket" in text
    assert "quorum_requests_in_flight" in text


def test_health_reports_models_and_queue(fleet: Fleet) -> None:
    """/health answers 200 with the seed's fields while serving."""
    r = fleet.client.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "healthy" and body["modelsLoaded"] == 5
    assert set(body) == {"status", "uptime", "modelsLoaded", "queueDepth"}


def test_unknown_path_and_wrong_method_use_the_error_envelope(fleet: Fleet) -> None:
    """404 for an unknown path and 405 for a wrong method answer in the runner's envelope."""
    missing = fleet.client.get("/v2/nothing")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    wrong = fleet.client.get("/v1/chat/completions")
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed"
    assert "allow" in wrong.headers

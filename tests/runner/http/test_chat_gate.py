"""The chat path calls one way: the front-end calls the path, the path asks only the gate
it was handed (runner/http/path_gate.py), never the front-end back; the gate asks the
scheduler's model gate in one place."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from runner.errors import ServiceUnavailable
from runner.http.asgi import Message
from runner.http.call import ClientCall
from runner.http.chat import ChatPath
from runner.http.headers import parse_request_headers
from runner.http.path_gate import PathGate
from runner.scheduler import SchedulerAdmission, SchedulerConfig
from runner.scheduler.grants import AdmissionRequest, Grant
from runner.telemetry.metrics import Metrics

pytestmark = pytest.mark.timeout(30)

BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


class CountedAdmission(SchedulerAdmission):
    """The scheduler's admission, counting how often the model gate is asked (and how
    often before the request reached the queue)."""

    asked = 0
    asked_before_queue = -1

    def check(self, model: str) -> None:
        self.asked += 1
        super().check(model)

    async def acquire(self, request: AdmissionRequest) -> Grant:
        self.asked_before_queue = self.asked
        return await super().acquire(request)


@pytest.fixture
async def admission() -> AsyncIterator[CountedAdmission]:
    """A scheduler that holds model `m` ready (one slot), and no engine for it."""
    admission = CountedAdmission(SchedulerConfig(model_concurrency={"m": 1}))
    await admission.start()
    yield admission
    await admission.stop()


def _call() -> ClientCall:
    """A chat request as the front-end hands it down: identified, its body unread."""
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY))]
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
    sent = False
    forever = asyncio.Event()

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        await forever.wait()  # the client stays
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        raise AssertionError(f"nothing is sent by the path on a refusal: {message}")

    return ClientCall(scope, receive, send, parse_request_headers(headers), "t")


async def test_chat_path_serves_with_its_gate_alone(admission: CountedAdmission) -> None:
    """The chat path serves a call with only its gate (no front-end exists): granted, its
    engine gone, it raises the gate's 503 with Retry-After; the grant is given back."""
    metrics = Metrics()
    chat = ChatPath(PathGate(admission, metrics), {}, metrics, 1 << 20)
    call = _call()
    with pytest.raises(ServiceUnavailable) as refused:
        await chat.serve(call)
    assert refused.value.headers["Retry-After"] == "1"
    assert "restarting" in str(refused.value)
    assert call.grant is not None  # it was admitted before the engine was looked up
    again = AdmissionRequest("again", "m", "t", "normal", 1, 1)
    await asyncio.wait_for(admission.acquire(again), 5)  # its one slot was given back


async def test_chat_path_asks_the_model_gate_once_on_its_way(
    admission: CountedAdmission,
) -> None:
    """Before its request reaches the scheduler's queue the chat path has asked the model
    gate once (`check_model`); only a granted request whose engine is gone asks it again,
    to say why (`engine_gone`)."""
    metrics = Metrics()
    chat = ChatPath(PathGate(admission, metrics), {}, metrics, 1 << 20)
    with pytest.raises(ServiceUnavailable):
        await chat.serve(_call())
    assert admission.asked_before_queue == 1
    assert admission.asked == 2

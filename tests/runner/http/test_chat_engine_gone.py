"""A request granted a slot whose engine is gone before the request reached it (the engine
died; the scheduler hears of it a moment later) gets a 503 with Retry-After, never a 502
nor a bare 503 (issue 17: queued requests never meet a generic error)."""

from __future__ import annotations

import io
import wave
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from runner.http.asgi import Receive, Scope, Send
from runner.http.audio.handler import AudioPath
from runner.http.audio.multipart import FormLimits
from runner.http.chat import ChatPath
from runner.http.frontend import FrontEnd
from runner.scheduler import SchedulerAdmission, SchedulerConfig
from runner.telemetry.metrics import Metrics
from tenants.config import TenantsConfig
from tenants.ratelimit import RateLimiter

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The chat and audio paths over a scheduler that holds model `m` ready, and no engine
    (nor speech worker) for it."""
    admission = SchedulerAdmission(SchedulerConfig(model_concurrency={"m": 1}))
    await admission.start()
    tenants, metrics = TenantsConfig(), Metrics()
    front = FrontEnd(admission, RateLimiter(tenants), tenants, metrics)
    chat = front.path(ChatPath(front.gate, {}, metrics, 1 << 20).serve)
    audio_path = AudioPath(front.gate, {}, metrics, FormLimits(temp_dir=str(tmp_path)))
    audio = front.path(audio_path.serve, json=False)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await (audio if scope["path"].startswith("/v1/audio/") else chat)(scope, receive, send)

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://runner") as c:
        yield c
    await admission.stop()


def _silence() -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * 16000)
    return out.getvalue()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/audio/transcriptions"])
async def test_engine_gone_after_the_grant_is_503_with_retry_after(
    client: httpx.AsyncClient, path: str
) -> None:
    """Granted, but no engine for the model is there any more: 503 with Retry-After."""
    if path.startswith("/v1/audio/"):
        files = {"file": ("a.wav", _silence(), "audio/wav")}
        r = await client.post(path, data={"model": "m"}, files=files)
    else:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        r = await client.post(path, json=body)
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "1"
    assert "restarting" in r.json()["error"]["message"]

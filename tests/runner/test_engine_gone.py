"""A request granted a slot whose engine is gone before the request reached it (the engine
died; the scheduler hears of it a moment later) gets a 503 with Retry-After, never a 502
nor a bare 503 (issue 17: queued requests never meet a generic error)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from runner.chat import ChatPath
from runner.frontend import FrontEnd
from runner.metrics import Metrics
from runner.scheduler import SchedulerAdmission, SchedulerConfig
from tenants.config import TenantsConfig
from tenants.ratelimit import RateLimiter

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """The chat path over a scheduler that holds model `m` ready, and no engine for it."""
    admission = SchedulerAdmission(SchedulerConfig(model_concurrency={"m": 1}))
    await admission.start()
    tenants, metrics = TenantsConfig(), Metrics()
    front = FrontEnd(admission, RateLimiter(tenants), tenants, metrics, models=admission)
    chat = ChatPath(front, {}, metrics, 1 << 20)
    transport = httpx.ASGITransport(app=chat)
    async with httpx.AsyncClient(transport=transport, base_url="http://runner") as c:
        yield c
    await admission.stop()


async def test_engine_gone_after_the_grant_is_503_with_retry_after(
    client: httpx.AsyncClient,
) -> None:
    """Granted, but the engine map has no engine for the model: 503 with Retry-After."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "1"
    assert "restarting" in r.json()["error"]["message"]

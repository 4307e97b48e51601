"""One suite for both audit head stores (memory and a real Redis), and the signed head."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from governance.audit_heads import (
    HEAD_CONTEXT,
    AuditKey,
    HeadStore,
    MemoryHeadStore,
    RedisHeadStore,
    public_key_from,
    sign_head,
    signature_holds,
)
from governance.errors import AuditUnavailable
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer
from tests.support.tokens import DEV_AUDIT_KEY, KEYS

KEY = AuditKey.load(DEV_AUDIT_KEY)


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[HeadStore]:
    if request.param == "memory":
        yield MemoryHeadStore()
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    redis_store = RedisHeadStore.from_url(server.url)
    yield redis_store
    await redis_store.aclose()


async def test_audit_heads_keep_the_latest_per_runner(store: HeadStore) -> None:
    """A head put is the one got back, the latest put wins, and runners do not mix."""
    assert await store.get("r1") is None
    await store.put(sign_head(KEY, "r1", 1, "a" * 64, 10.0))
    await store.put(sign_head(KEY, "r1", 2, "b" * 64, 11.0))
    await store.put(sign_head(KEY, "r2", 7, "c" * 64, 12.0))
    first, second = await store.get("r1"), await store.get("r2")
    assert first == sign_head(KEY, "r1", 2, "b" * 64, 11.0)
    assert second is not None and (second.count, second.last_hash) == (7, "c" * 64)


async def test_audit_heads_redis_unreachable_is_503() -> None:
    """A head store that cannot be reached raises AuditUnavailable (fail closed)."""
    store = RedisHeadStore.from_url(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5)
    with pytest.raises(AuditUnavailable):
        await store.put(sign_head(KEY, "r1", 1, "a" * 64, 10.0))
    with pytest.raises(AuditUnavailable):
        await store.get("r1")
    await store.aclose()


def test_audit_head_signature_covers_count_and_hash() -> None:
    """A head verifies under the dev key's published half; a changed count does not."""
    head = sign_head(KEY, "r1", 3, "d" * 64, 10.0)
    public = public_key_from((KEYS / "audit.dev.pub").read_text())
    assert signature_holds(public, HEAD_CONTEXT, head.unsigned(), head.sig)
    forged = {**head.unsigned(), "count": 2}
    assert not signature_holds(public, HEAD_CONTEXT, forged, head.sig)

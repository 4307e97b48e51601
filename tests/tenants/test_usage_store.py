"""Usage stores, SQLite and a real Redis, through one suite: batches add up, queries
filter and range, what was stored survives a new store on the same file or Redis."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tenants.usage import Counts, hour_of, rows
from tenants.usage_store import RedisUsageStore, SqliteUsageStore, UsageStore
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(30)

H = hour_of(time.time()) - 7200  # two hours ago: Redis keeps it (retention one day)


@pytest.fixture(params=["sqlite", "redis"])
async def opener(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Callable[[], UsageStore]]:
    opened: list[UsageStore] = []

    def open_store() -> UsageStore:
        if request.param == "sqlite":
            store: UsageStore = SqliteUsageStore(tmp_path / "usage.sqlite3")
        else:
            server: RedisServer = request.getfixturevalue("redis_server")
            store = RedisUsageStore.from_url(server.url, retention_s=86_400)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        await store.aclose()


async def test_usage_store_adds_batches_and_filters(opener: Callable[[], UsageStore]) -> None:
    """Two batches for one hour add up; a query filters by tenant, model and range."""
    store = opener()
    one = Counts(requests=2, ok=2, prompt_tokens=30, completion_tokens=12, engine_seconds=0.5)
    await store.add({(H, "acme", "m"): one, (H, "globex", "m"): Counts(requests=1, refused=1)})
    await store.add({(H, "acme", "m"): Counts(requests=1, cancelled=1, completion_tokens=3)})
    await store.add({(H + 3600, "acme", "n"): Counts(requests=1, ok=1, images=2)})
    acme = await store.query(H, H + 7200, tenant="acme")
    assert acme[(H, "acme", "m")] == Counts(
        requests=3, ok=2, cancelled=1, prompt_tokens=30, completion_tokens=15,
        engine_seconds=0.5,
    )  # fmt: skip
    assert set(acme) == {(H, "acme", "m"), (H + 3600, "acme", "n")}
    assert set(await store.query(H, H + 3600)) == {(H, "acme", "m"), (H, "globex", "m")}
    assert set(await store.query(H, H + 7200, model="n")) == {(H + 3600, "acme", "n")}


async def test_usage_store_survives_a_new_store(opener: Callable[[], UsageStore]) -> None:
    """What one store wrote, another opened on the same file (or Redis) reads: a restart
    loses nothing that was flushed."""
    await opener().add({(H, "acme", "m"): Counts(requests=1, ok=1, prompt_tokens=7)})
    again = await opener().query(H, H + 3600)
    assert again[(H, "acme", "m")].prompt_tokens == 7


def test_usage_rows_group_by_day() -> None:
    """Rows per day add the hours of that UTC day; each row names tenant, model, start."""
    H = 1_767_225_600  # 2026-01-01T00:00:00Z
    hours = {
        (H, "acme", "m"): Counts(requests=1, ok=1, prompt_tokens=5),
        (H + 3600, "acme", "m"): Counts(requests=2, ok=2, prompt_tokens=6),
    }
    (day,) = rows(hours, "day")
    assert day["start"] == "2026-01-01T00:00:00Z" and day["requests"] == 3
    assert day["promptTokens"] == 11 and day["requestsByOutcome"] == {
        "ok": 3, "cancelled": 0, "refused": 0, "failed": 0,
    }  # fmt: skip
    assert [r["start"] for r in rows(hours, "hour")] == [
        "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z",
    ]  # fmt: skip

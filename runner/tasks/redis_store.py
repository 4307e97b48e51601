"""Load tasks in Redis, so every replica answers for every task (see `store.py` for
the promises both stores keep).

Layout (`prefix` defaults to `quorum:task:`; the scripts build task keys from it, so on
a Redis Cluster `from_url` puts the prefix in a hash tag, `{quorum:task}:`: every key
below is in one slot)::

    <prefix><taskId>        the record as JSON; EX retention_s once terminal
    <prefix>model:<runner>:<model>  taskId of the runner's active task for the model (the
                                    join index: each replica loads its own models)
    <prefix>active          SET of active task ids (list_active, mark_interrupted)

Every write that must be atomic is one Lua script: `put` checks the stored status and
updates the indexes with the record; `create_or_join` reads the runner's index for the
model and creates the task only when there is no live one (one SET under one script, so
two loads of one model racing on one runner end with one task). Redis failures become
`TaskStoreUnavailable` (503) in one place, `_translated`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from faults.redis_clients import one_slot, redis_client
from runner.tasks.errors import TaskStoreUnavailable
from runner.tasks.record import LoadTask
from runner.tasks.state import ACTIVE, statuses_that_may_become
from runner.tasks.store import (
    DEFAULT_RETENTION_S,
    DEFAULT_STALE_AFTER_S,
    check_new,
    fail_each,
    interrupted_reason,
    stale_reason,
)

DEFAULT_PREFIX = "quorum:task:"

# KEYS: task key, model key, active set.
# ARGV: json, task id, ",statuses the stored record may have,", "1" if terminal, retention_s.
# Returns nil when written, else the stored record (the write lost to a later state).
_PUT = """
local raw = redis.call('GET', KEYS[1])
if raw then
  local cur = cjson.decode(raw)
  if not string.find(ARGV[3], ',' .. cur.status .. ',', 1, true) then return raw end
end
if ARGV[4] == '1' then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[5])
  redis.call('SREM', KEYS[3], ARGV[2])
  if redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('DEL', KEYS[2]) end
else
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('SADD', KEYS[3], ARGV[2])
  redis.call('SET', KEYS[2], ARGV[2], 'NX')
end
return false
"""

# KEYS: model key, new task key, active set.
# ARGV: new json, new id, prefix, ",active statuses,", stale cutoff ('' = never stale).
# Returns {0, json} joined, {1, json} created, {2, json} the current task is stale.
_CREATE_OR_JOIN = """
local cur_id = redis.call('GET', KEYS[1])
if cur_id then
  local raw = redis.call('GET', ARGV[3] .. cur_id)
  if raw then
    local cur = cjson.decode(raw)
    if string.find(ARGV[4], ',' .. cur.status .. ',', 1, true) then
      if ARGV[5] == '' or tonumber(cur.updated_at) >= tonumber(ARGV[5]) then
        return {0, raw}
      end
      return {2, raw}
    end
  end
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[2])
return {1, ARGV[1]}
"""

_ACTIVE_CSV = "," + ",".join(sorted(s.value for s in ACTIVE)) + ","
_STALE_ROUNDS = 3  # a stale task is failed and the create retried at most this often


@asynccontextmanager
async def _translated() -> AsyncIterator[None]:
    """The one place Redis failures become `TaskStoreUnavailable` (503)."""
    try:
        yield
    except (RedisError, OSError) as exc:
        raise TaskStoreUnavailable(detail=type(exc).__name__, retry_after=1) from exc


def _decode(raw: bytes | str) -> LoadTask:
    return LoadTask.from_record(orjson.loads(raw))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _encode(task: LoadTask) -> bytes:
    return orjson.dumps(task.to_record())


class RedisTaskStore:
    """Tasks shared by every replica through one Redis; writes are Lua scripts (atomic).

    `aclose` closes `client`, which the store owns from then on.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str = DEFAULT_PREFIX,
        *,
        retention_s: int = DEFAULT_RETENTION_S,
        stale_after_s: float | None = DEFAULT_STALE_AFTER_S,
    ) -> None:
        if retention_s < 1:
            raise ValueError("retention_s must be at least 1 second")
        self._client = client
        self._prefix = prefix
        self._retention_s = retention_s
        self._stale_after_s = stale_after_s
        self._put_script = client.register_script(_PUT)
        self._create_script = client.register_script(_CREATE_OR_JOIN)

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        *,
        timeout_s: float = 2.0,
        retention_s: int = DEFAULT_RETENTION_S,
        stale_after_s: float | None = DEFAULT_STALE_AFTER_S,
    ) -> RedisTaskStore:
        """A store on its own client for `url` (`REDIS_URL`); commands time out after
        `timeout_s`, so a hung Redis answers 503 fast instead of holding a request."""
        client = redis_client(url, timeout_s)
        return cls(
            client, one_slot(url, prefix), retention_s=retention_s, stale_after_s=stale_after_s
        )

    def task_key(self, task_id: str) -> str:
        return self._prefix + task_id

    def model_key(self, runner_id: str, model_id: str) -> str:
        return f"{self._prefix}model:{runner_id}:{model_id}"

    @property
    def active_key(self) -> str:
        return self._prefix + "active"

    async def put(self, task: LoadTask) -> LoadTask:
        allowed = "," + ",".join(s.value for s in statuses_that_may_become(task.status)) + ","
        async with _translated():
            stored = await self._put_script(
                keys=[
                    self.task_key(task.task_id),
                    self.model_key(task.runner_id, task.model_id),
                    self.active_key,
                ],
                args=[
                    _encode(task),
                    task.task_id,
                    allowed,
                    "1" if task.status.terminal else "0",
                    self._retention_s,
                ],
            )
        return task if stored is None else _decode(stored)

    async def get(self, task_id: str) -> LoadTask | None:
        async with _translated():
            raw = await self._client.get(self.task_key(task_id))
        return None if raw is None else _decode(raw)

    async def create_or_join(self, task: LoadTask) -> tuple[LoadTask, bool]:
        """1. The script joins the runner's active task for the model if it was written within
           `stale_after_s` of `task.created_at`, else creates `task` -> done.
        2. It answered "stale": fail that task as interrupted (a guarded put) and retry.
        """
        check_new(task)
        cutoff = "" if self._stale_after_s is None else repr(task.created_at - self._stale_after_s)
        for _ in range(_STALE_ROUNDS):
            async with _translated():
                outcome, raw = await self._create_script(
                    keys=[
                        self.model_key(task.runner_id, task.model_id),
                        self.task_key(task.task_id),
                        self.active_key,
                    ],
                    args=[_encode(task), task.task_id, self._prefix, _ACTIVE_CSV, cutoff],
                )
            if outcome != 2:  # 1
                return (task, True) if outcome == 1 else (_decode(raw), False)
            stale = _decode(raw)  # 2
            await self.put(stale.fail(stale_reason(stale, task.created_at), now=task.created_at))
        raise TaskStoreUnavailable(
            detail=f"model {task.model_id!r} kept a stale task", retry_after=1
        )

    async def list_active(self) -> list[LoadTask]:
        async with _translated():
            ids = sorted(_text(m) for m in await self._client.smembers(self.active_key))
            if not ids:
                return []
            raws = await self._client.mget([self.task_key(i) for i in ids])
            gone = [i for i, raw in zip(ids, raws, strict=True) if raw is None]
            if gone:
                await self._client.srem(self.active_key, *gone)
        tasks = [_decode(raw) for raw in raws if raw is not None]
        return sorted((t for t in tasks if t.status.active), key=lambda t: t.created_at)

    async def mark_interrupted(
        self, runner_id: str, reason: str = "runner restarted", *, now: float
    ) -> int:
        mine = [t for t in await self.list_active() if t.runner_id == runner_id]
        return await fail_each(self, (t.fail(interrupted_reason(reason, t), now=now) for t in mine))

    async def aclose(self) -> None:
        await self._client.aclose()

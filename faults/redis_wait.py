"""A write that must survive a failover, acknowledged by replicas before it is trusted.

Redis replicates asynchronously: the primary answers a write before any replica has it,
and a failover in between promotes a replica without it (a spent nonce spendable again).
`WAIT numreplicas timeout` blocks until that many replicas acknowledged every write made
*on the same connection* so far, or the timeout passed, and answers how many did. So the
write and its WAIT are sent together on one connection:

- a plain or Sentinel client: a pipeline without MULTI (redis-py sends a pipeline on one
  connection of the pool; WAIT cannot block inside MULTI);
- a cluster client (`RedisCluster`): redis-py routes a bare WAIT to every primary and adds
  the answers, which says nothing of this write; so both commands go as one pipeline to
  the node that owns the key's slot (`ClusterNode.execute_pipeline`, one connection).

`replicas=0` sends the write alone. `AutoReplicas` (`NONCE_REPLICAS=auto`, the default)
asks for 1 where the primary has replicas and 0 where it has none (a lone dev Redis): before
each such write it reads `INFO replication` from the primary that takes it (one round trip
more, on a lifecycle call only) and keeps, per primary (its `master_replid`, new after a
failover or a restart), the most replicas it has seen connected. A primary that once had a
replica keeps asking for one when the replica drops (the write is then refused, not trusted
unacknowledged); a new primary is judged afresh (a promoted replica alone: 0, until a
replica attaches to it). A WAIT that counts fewer replicas than asked does not undo the
write: the caller decides (`governance/nonces.py` releases the nonce and refuses the
operation).

`acknowledging_client` and `write_or_refuse` are what the stores use: a client whose socket
timeout outlasts the WAIT, and the write with the store's own errors for an outage and for
too few replicas (`governance/nonces.py`, `tenants/policy_store.py`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.asyncio.cluster import PipelineCommand, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT

from faults.redis_clients import redis_client

AUTO: Literal["auto"] = "auto"
ReplicasSetting = int | Literal["auto"]  # NONCE_REPLICAS
KEPT_PRIMARIES = 16  # the primaries AutoReplicas remembers (failovers and restarts seen)


@dataclass(slots=True)
class AutoReplicas:
    """NONCE_REPLICAS=auto: 1 where the primary has (had) a replica, else 0."""

    seen: dict[str, int] = field(default_factory=dict)  # master_replid -> most replicas

    def asked(self, info: Mapping[str, Any]) -> int:
        """The replicas to WAIT for, from the primary's `INFO replication`.

        1. The primary is known by its replication id (a failover or a restart without
           persistence gives a new one: that primary is judged afresh).
        2. Keep the most replicas this primary has had connected (a replica that dropped
           does not lower it: its writes are then refused rather than trusted).
        3. 1 when it has had one, else 0 (a lone Redis: nothing to wait for).
        """
        # 1. which primary
        replid = str(info.get("master_replid", ""))
        connected = int(info.get("connected_slaves", 0) or 0)
        # 2. the most it has had
        most = max(self.seen.pop(replid, 0), connected)
        self.seen[replid] = most  # last in: the newest
        while len(self.seen) > KEPT_PRIMARIES:
            del self.seen[next(iter(self.seen))]
        # 3. one where it has replicas
        return min(1, most)


def replicas_of(setting: ReplicasSetting) -> int | AutoReplicas:
    """What the stores hold for NONCE_REPLICAS: a count, or an `AutoReplicas` of their own."""
    return AutoReplicas() if setting == AUTO else int(setting)


@dataclass(frozen=True, slots=True)
class Acknowledged:
    """The write's reply, and how many replicas acknowledged it (`asked` when none was)."""

    reply: Any
    replicas: int
    asked: int

    @property
    def enough(self) -> bool:
        return self.replicas >= self.asked


async def write_acknowledged(
    client: aioredis.Redis,
    key: str,
    command: Sequence[EncodableT],
    replicas: int | AutoReplicas,
    timeout_ms: int,
) -> Acknowledged:
    """Send `command` (which writes `key`), then `WAIT replicas timeout_ms`, on one connection.

    0. `AutoReplicas`: the count from the primary of `key` now (`INFO replication`).
    1. `replicas` <= 0: the command alone -> acknowledged by definition.
    2. A cluster client: both to the primary of `key`'s slot, on one connection of that node;
       a connection lost there makes the client read the slot map again before the next call.
    3. Otherwise: one pipeline (no MULTI) on one connection of the client's pool.
    Redis errors are raised as they are (the stores translate them).
    """
    # 0. as many as the primary has (had)
    if isinstance(replicas, AutoReplicas):
        replicas = replicas.asked(await _replication(client, key))
    # 1. no replica asked for
    if replicas <= 0:
        reply = await client.execute_command(*command)  # type: ignore[no-untyped-call]
        return Acknowledged(reply, 0, 0)
    wait = ("WAIT", replicas, timeout_ms)
    # 2. a cluster: the node that owns the key, one connection
    if isinstance(client, RedisCluster):
        replies = await node_pipeline(client, key, [command, wait])
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return Acknowledged(replies[0], int(replies[1]), replicas)
    # 3. one pipeline, one connection
    async with client.pipeline(transaction=False) as pipe:
        pipe.execute_command(*command)
        pipe.execute_command(*wait)
        reply, acked = await pipe.execute()
    return Acknowledged(reply, int(acked), replicas)


def acknowledging_client(url: str, timeout_s: float, timeout_ms: int) -> aioredis.Redis:
    """A client for writes followed by `WAIT ... timeout_ms`: its socket timeout outlasts the
    WAIT by a second, so a WAIT that runs out answers its count instead of timing the
    connection out."""
    return redis_client(url, max(timeout_s, timeout_ms / 1000 + 1.0))


async def write_or_refuse(
    client: aioredis.Redis,
    key: str,
    command: Sequence[EncodableT],
    replicas: int | AutoReplicas,
    timeout_ms: int,
    *,
    unavailable: Callable[[Exception], Exception],
    short: Callable[[Acknowledged], Awaitable[Exception]],
) -> Acknowledged:
    """`write_acknowledged`, with the store's own errors.

    1. Redis unreachable or failing -> `unavailable(exc)`, raised from it.
    2. A write that wrote (a truthy reply) acknowledged by fewer replicas than asked ->
       the error `short(done)` returns, once it undid what it undoes, raised.
    3. Otherwise the reply and its count (a falsy reply, a SET NX on a key already there,
       wrote nothing that a failover could lose).
    """
    try:  # 1
        done = await write_acknowledged(client, key, command, replicas, timeout_ms)
    except (RedisError, OSError) as exc:
        raise unavailable(exc) from exc
    if done.reply and not done.enough:  # 2
        raise await short(done)
    return done  # 3


async def _replication(client: aioredis.Redis, key: str) -> Mapping[str, Any]:
    """`INFO replication` of the primary that takes `key` (parsed by redis-py)."""
    if isinstance(client, RedisCluster):
        (info,) = await node_pipeline(client, key, [("INFO", "replication")])
        if isinstance(info, Exception):
            raise info
    else:
        info = await client.execute_command("INFO", "replication")  # type: ignore[no-untyped-call]
    return info if isinstance(info, Mapping) else {}


async def node_pipeline(
    client: RedisCluster, key: str, commands: Sequence[Sequence[EncodableT]]
) -> list[Any]:
    """`commands` in one pipeline on one connection to the primary of `key`'s slot (redis-py
    refuses scripts and keyless commands in its cluster pipelines); each reply, or the error
    it was. A connection lost there makes the client read the slot map again."""
    sent = [PipelineCommand(i, *command) for i, command in enumerate(commands)]
    try:
        await client.initialize()  # the slot map, read once (a no-op afterwards)
        node = client.get_node_from_key(key)  # raises when no node serves the slot
        assert node is not None  # None only when asked for a replica
        await node.execute_pipeline(sent)
    except (RedisConnectionError, RedisTimeoutError, OSError):
        await client.nodes_manager.initialize()
        raise
    return [done.result for done in sent]

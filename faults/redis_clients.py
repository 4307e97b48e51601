"""How every Redis client of the stores connects (nonces, rate windows, load tasks, jobs,
memory leases), in one place, so that all of them come back alike after Redis restarts.

A restarted Redis leaves each connection a client kept in its pool dead, and redis-py's
`from_url` clients do not retry: the first command on each would fail (a 503 answered,
a write lost) although Redis is back. So a command whose connection turns out closed
(`ConnectionError`) is sent once more, at once, on a new connection. A timeout is never
retried: the command may have run, and running a rate-limit hit or a nonce twice would
count it twice.

Sentinel (`REDIS_MODE=sentinel`): the settings turn `REDIS_SENTINELS`,
`REDIS_SENTINEL_SERVICE` and `REDIS_URL`'s password, db and TLS into one URL,
`redis+sentinel://[user:password@]host:port,host:port/<service>[/<db>]` (`rediss+sentinel`
for TLS to the primary), and every client and pool built here for such a URL asks the
sentinels where the primary is at each new connection (redis-py's `Sentinel`). After a
failover the old primary's connections fail or answer READONLY; redis-py closes them, the
one retry above reconnects, and the command goes to the new primary.

Cluster (`REDIS_MODE=cluster`): the settings turn `REDIS_URL` (any node) and
`REDIS_CLUSTER_NODES` (more nodes to start from) into
`redis+cluster://[user:password@]host:port,host:port` (`rediss+cluster` for TLS), and the
client is redis-py's `RedisCluster`, which learns the slot map from those nodes and sends
each command to the primary of its key's slot (following MOVED and ASK). It is typed as
`Redis` for the stores: it answers every command they send, and each multi-key command,
script and MULTI of theirs keeps its keys in one slot (hash tags, docs/operations.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.typing import EncodableT

SENTINEL_SCHEMES = ("redis+sentinel://", "rediss+sentinel://")
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """Where the sentinels are, which service they watch, and how to speak to its primary."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    ssl: bool = False


def is_sentinel_url(url: str) -> bool:
    return url.startswith(SENTINEL_SCHEMES)


def parse_sentinel_url(url: str) -> SentinelTarget:
    """`redis+sentinel://[user:pw@]h:p,h:p/<service>[/<db>]`; ValueError when malformed."""
    if not is_sentinel_url(url):
        raise ValueError(f"not a sentinel URL: must start with {' or '.join(SENTINEL_SCHEMES)}")
    scheme, rest = url.split("://", 1)
    auth, _, hosts_path = rest.rpartition("@")
    hosts, _, path = hosts_path.partition("/")
    sentinels = _host_ports(hosts, "sentinel")
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ValueError("expected /<service>[/<db>] after the sentinels")
    username, _, password = auth.partition(":")
    return SentinelTarget(
        tuple(sentinels),
        unquote(parts[0]),
        int(parts[1]) if len(parts) == 2 else 0,
        unquote(username) or None,
        unquote(password) or None,
        scheme.startswith("rediss"),
    )


def sentinel_url(sentinels: str, service: str, base_url: str | None = None) -> str:
    """The URL of `service` watched by `sentinels` (`host:port,...`), with the user,
    password, db and TLS of `base_url` (a `redis://` or `rediss://` REDIS_URL; its host is
    not used)."""
    base = urlsplit(base_url or "redis://")
    scheme = "rediss+sentinel" if base.scheme == "rediss" else "redis+sentinel"
    auth = ""
    if base.username or base.password:
        auth = f"{base.username or ''}:{base.password or ''}@"
    db = base.path.strip("/") or "0"
    url = f"{scheme}://{auth}{sentinels.replace(' ', '')}/{service}/{db}"
    parse_sentinel_url(url)  # refuse now what could not be used later
    return url


@dataclass(frozen=True, slots=True)
class ClusterTarget:
    """The nodes a cluster client starts from, and how to speak to them."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    ssl: bool = False


def is_cluster_url(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEMES)


def _host_ports(hosts: str, what: str) -> list[tuple[str, int]]:
    found = []
    for item in hosts.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"{what} {item!r}: expected host:port")
        found.append((host, int(port)))
    return found


def parse_cluster_url(url: str) -> ClusterTarget:
    """`redis+cluster://[user:pw@]h:p,h:p[/0]`; ValueError when malformed (a cluster has
    only db 0)."""
    if not is_cluster_url(url):
        raise ValueError(f"not a cluster URL: must start with {' or '.join(CLUSTER_SCHEMES)}")
    scheme, rest = url.split("://", 1)
    auth, _, hosts_path = rest.rpartition("@")
    hosts, _, path = hosts_path.partition("/")
    if path.strip("/") not in ("", "0"):
        raise ValueError("a Redis Cluster has only db 0")
    username, _, password = auth.partition(":")
    return ClusterTarget(
        tuple(_host_ports(hosts, "cluster node")),
        unquote(username) or None,
        unquote(password) or None,
        scheme.startswith("rediss"),
    )


def cluster_url(base_url: str | None, nodes: str = "") -> str:
    """The URL of the cluster that `base_url` (a `redis://` or `rediss://` REDIS_URL naming
    any node, with the user, password and TLS) and `nodes` (`host:port,...`, more nodes to
    start from) name."""
    base = urlsplit(base_url or "redis://")
    if base.path.strip("/") not in ("", "0"):
        raise ValueError("a Redis Cluster has only db 0")
    hosts = [f"{base.hostname}:{base.port or 6379}"] if base.hostname else []
    hosts += [n.strip() for n in nodes.split(",") if n.strip()]
    if not hosts:
        raise ValueError("no cluster node: set REDIS_URL or REDIS_CLUSTER_NODES")
    scheme = "rediss+cluster" if base.scheme == "rediss" else "redis+cluster"
    auth = ""
    if base.username or base.password:
        auth = f"{base.username or ''}:{base.password or ''}@"
    url = f"{scheme}://{auth}{','.join(hosts)}/0"
    parse_cluster_url(url)  # refuse now what could not be used later
    return url


def one_slot(url: str, prefix: str) -> str:
    """`prefix` for keys that one script or MULTI touches together: on a cluster URL its
    name in a hash tag (`quorum:task:` -> `{quorum:task}:`), so they all hash to one slot;
    elsewhere unchanged (a Redis in use keeps its key names)."""
    if not is_cluster_url(url) or "{" in prefix:
        return prefix
    return "{" + prefix.rstrip(":") + "}:"


def reconnecting_retry() -> Retry:
    """One more try, on a new connection, when the connection was found closed."""
    return Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))


def redis_client(url: str, timeout_s: float) -> aioredis.Redis:
    """A client for `url` (`REDIS_URL`) whose connect and commands time out after
    `timeout_s` (a hung Redis answers 503 fast), retried once on a closed connection."""
    if is_cluster_url(url):
        return cast("aioredis.Redis", cluster_client(parse_cluster_url(url), timeout_s))
    if is_sentinel_url(url):
        return aioredis.Redis.from_pool(redis_pool(url, timeout_s))  # closed with the client
    return aioredis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=reconnecting_retry(),
    )


class _Cluster(RedisCluster):
    """redis-py's cluster client, which reads the slot map before a command's routing does:
    redis-py 8.1 routes commands sent concurrently to a client not yet initialized on
    connections not yet open (AttributeError on `writelines`)."""

    async def execute_command(self, *args: EncodableT, **kwargs: Any) -> Any:
        await self.initialize()  # once; then a flag read
        return await super().execute_command(*args, **kwargs)


async def ready(client: aioredis.Redis) -> None:
    """Before `client.pubsub()`: a cluster client reads its slot map first (its pub/sub picks
    the node by the channel's slot, from that map); any other client needs nothing."""
    if isinstance(client, RedisCluster):
        await client.initialize()


def cluster_client(target: ClusterTarget, timeout_s: float) -> RedisCluster:
    """redis-py's cluster client from `target`'s nodes; a command that finds its node gone
    is sent again after the slot map is read anew (redis-py's own retries)."""
    return _Cluster(
        startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
        username=target.username,
        password=target.password,
        ssl=target.ssl,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
    )


def redis_pool(url: str, timeout_s: float) -> aioredis.ConnectionPool:
    """The same settings as `redis_client`, as a pool (for a library that takes one; not
    for a cluster, whose client keeps a pool per node)."""
    if is_cluster_url(url):
        raise ValueError("a Redis Cluster has no single pool: use redis_client")
    if is_sentinel_url(url):
        return _sentinel_pool(parse_sentinel_url(url), timeout_s)
    return aioredis.ConnectionPool.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=reconnecting_retry(),
    )


class _SentinelPool(SentinelConnectionPool):
    """redis-py's pool of connections to the primary, which also closes its connections to
    the sentinels when it is closed (redis-py's leaves them open), and whose question to
    the sentinels fails as a Redis connection error only: redis-py 8.1, asking while a
    sentinel connection is being opened by a concurrent command that timed out, raises
    AttributeError (`writelines` on None) or RuntimeError (uvloop: the transport closed),
    which the stores would not take for Redis being away (the chaos soak saw a 500)."""

    async def get_master_address(self) -> Any:
        try:
            return await super().get_master_address()  # type: ignore[no-untyped-call]
        except (AttributeError, RuntimeError) as exc:
            raise RedisConnectionError(f"asking the sentinels failed: {exc!r}") from exc

    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        for client in self.sentinel_manager.sentinels:
            await client.aclose()


def _sentinel_pool(target: SentinelTarget, timeout_s: float) -> SentinelConnectionPool:
    """A pool whose connections go to the primary the sentinels name at connect time."""
    timeouts = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=timeouts)  # type: ignore[no-untyped-call]
    return _SentinelPool(  # type: ignore[no-untyped-call]
        target.service,
        sentinel,
        db=target.db,
        username=target.username,
        password=target.password,
        ssl=target.ssl,
        retry=reconnecting_retry(),
        **timeouts,
    )

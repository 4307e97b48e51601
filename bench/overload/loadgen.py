"""Open- and closed-loop HTTP load for the overload bench, in its own process.

    python -m bench.overload.loadgen --url http://127.0.0.1:P --mode open --rate 160 \
        --duration 20 [--arrivals poisson|constant] [--tenants t0,t1,t2,t3] [--warmup 2]
    python -m bench.overload.loadgen --url http://127.0.0.1:P --mode closed --concurrency 4 \
        --duration 10

Open loop: arrival times are drawn up front (Poisson, or evenly spaced) and each request is
sent at its time whatever happened to the earlier ones, on an idle keep-alive connection
from a pool (LIFO; a new one is opened when none is idle). So a slow answer never slows the
offered load, unlike a closed loop. Closed loop: `concurrency` workers, each on its own
connection, send the next request as soon as the previous answer arrived.

Each request is a small non-streamed chat completion with `X-Tenant-ID` (tenants drawn
uniformly at random, seeded). Latency is timed from the moment the request is written to
the end of its answer's body. It prints one line `BENCH_JSON {...}`; times in ms.

To show the client is not the bottleneck it reports its achieved send rate against the
target, how late each send was against its scheduled time (`send_lag`), its own CPU seconds,
and the connections it had to open. Python's garbage collector is off while it runs (no
collector pause lands inside a timed request).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import random
import resource
import sys
import time
from dataclasses import asdict
from urllib.parse import urlsplit

import uvloop

from bench.overload.samples import Sample, summarize

PATH = "/v1/chat/completions"
BODY = json.dumps(
    {
        "model": "echo",
        "messages": [{"role": "user", "content": "Say hello to the overload bench."}],
        "max_tokens": 16,
    },
    separators=(",", ":"),
).encode()
_MARK = "BENCH_JSON "


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Pool:
    """Idle keep-alive connections to one host, reused last-in first-out."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[Conn] = []
        self.opened = 0
        self.stale = 0

    async def open(self) -> Conn:
        self.opened += 1
        return await asyncio.open_connection(self.host, self.port)

    async def get(self) -> Conn:
        while self.idle:
            reader, writer = self.idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return await self.open()

    def put(self, conn: Conn) -> None:
        self.idle.append(conn)

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


def _request(host: str, port: int, tenant: str) -> bytes:
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"X-Tenant-ID: {tenant}\r\nContent-Length: {len(BODY)}\r\n\r\n"
    )
    return head.encode() + BODY


async def _exchange(conn: Conn, req: bytes, s: Sample) -> bool:
    """Write `req`, read the whole answer into `s`; True if the connection can be reused."""
    reader, writer = conn
    s.sent = time.perf_counter()
    writer.write(req)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = -1
    chunked, keep = False, True
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        elif name == b"retry-after":
            s.retry_after = value.strip().decode()
        elif name == b"connection" and b"close" in value.lower():
            keep = False
    if chunked:
        parts = []
        while True:
            size = int((await reader.readline()).split(b";", 1)[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            parts.append((await reader.readexactly(size + 2))[:-2])
        body = b"".join(parts)
    elif length >= 0:
        body = await reader.readexactly(length)
    else:
        body = await reader.read()
        keep = False
    s.done = time.perf_counter()
    s.status = status
    if status != 200:
        with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
            s.code = str(json.loads(body)["error"]["code"])
    return keep


async def _send(pool: Pool, req: bytes, s: Sample, timeout: float) -> None:
    """One request on a pooled connection; a stale connection is retried once on a new one."""
    for attempt in (1, 2):
        conn = await pool.get() if attempt == 1 else await pool.open()
        try:
            keep = await asyncio.wait_for(_exchange(conn, req, s), timeout)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            conn[1].close()
            if attempt == 1:  # most likely a keep-alive connection the server had closed
                pool.stale += 1
                continue
            s.error = type(exc).__name__
            return
        except TimeoutError:
            conn[1].close()
            s.error = "timeout"
            return
        if keep:
            pool.put(conn)
        else:
            conn[1].close()
        return


def _arrivals(rate: float, duration: float, kind: str, rng: random.Random) -> list[float]:
    times: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate) if kind == "poisson" else 1.0 / rate
        if t >= duration:
            return times
        times.append(t)


async def open_loop(args: argparse.Namespace, host: str, port: int) -> tuple[list[Sample], Pool]:
    rng = random.Random(args.seed)
    tenants = args.tenants.split(",")
    reqs = {t: _request(host, port, t) for t in tenants}
    pool = Pool(host, port)
    pool.idle = [await pool.open() for _ in range(args.preopen)]
    offsets = _arrivals(args.rate, args.duration, args.arrivals, rng)
    samples: list[Sample] = []
    tasks: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    for off in offsets:
        at = start + off
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tenant = tenants[rng.randrange(len(tenants))]
        s = Sample(tenant, at)
        samples.append(s)
        task = loop.create_task(_send(pool, reqs[tenant], s, args.timeout))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=args.timeout + 1)
    for task in list(tasks):
        task.cancel()
    pool.close()
    for s in samples:
        s.scheduled -= start
        s.sent = s.sent - start if s.sent else 0.0
        s.done = s.done - start if s.done else 0.0
    return samples, pool


async def closed_loop(args: argparse.Namespace, host: str, port: int) -> tuple[list[Sample], Pool]:
    rng = random.Random(args.seed)
    tenants = args.tenants.split(",")
    reqs = {t: _request(host, port, t) for t in tenants}
    pool = Pool(host, port)
    pool.idle = [await pool.open() for _ in range(args.concurrency)]
    samples: list[Sample] = []
    start = time.perf_counter()
    end = start + args.duration

    async def worker() -> None:
        while time.perf_counter() < end:
            tenant = tenants[rng.randrange(len(tenants))]
            s = Sample(tenant, time.perf_counter())
            samples.append(s)
            await _send(pool, reqs[tenant], s, args.timeout)
            if s.error:
                await asyncio.sleep(0.01)

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    pool.close()
    for s in samples:
        s.scheduled -= start
        s.sent = s.sent - start if s.sent else 0.0
        s.done = s.done - start if s.done else 0.0
    return samples, pool


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--mode", choices=("open", "closed"), default="open")
    p.add_argument("--rate", type=float, default=100.0, help="open loop: arrivals per second")
    p.add_argument("--arrivals", choices=("poisson", "constant"), default="poisson")
    p.add_argument("--concurrency", type=int, default=4, help="closed loop: workers")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of sending")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds left out of the figures")
    p.add_argument("--tenants", default="t0,t1,t2,t3")
    p.add_argument("--preopen", type=int, default=64, help="open loop: connections opened first")
    p.add_argument("--timeout", type=float, default=10.0, help="per request, seconds")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--raw", default=None, help="also write every sample to this JSON file")
    args = p.parse_args(argv)
    if args.duration > 300 or args.warmup >= args.duration:
        p.error("--duration must be <= 300 s and longer than --warmup")
    url = urlsplit(args.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    if host not in ("127.0.0.1", "localhost"):
        p.error("only 127.0.0.1 is allowed")
    # No collector pauses inside timed requests; a bounded run's garbage fits in memory.
    gc.collect()
    gc.freeze()
    gc.disable()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    fn = open_loop if args.mode == "open" else closed_loop
    samples, pool = uvloop.run(fn(args, host, port))
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    if args.raw:
        with open(args.raw, "w") as f:
            json.dump([asdict(s) for s in samples], f)
    sys.stdout.write(_MARK + json.dumps(summarize(samples, pool, args, cpu)) + "\n")


if __name__ == "__main__":
    main()

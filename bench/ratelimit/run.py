"""Cost of one rate-limit decision (`RateLimiter.hit` + `headers`), memory and Redis.

    .venv/bin/python bench/ratelimit/run.py [--n 20000] [--redis-url redis://...]

Without `--redis-url` a throwaway redis-server is started on a free port (needs
`redis-server` on PATH; `--no-redis` skips it). Each case times every call with
`perf_counter_ns` and reports p50/p99/mean in microseconds; for Redis it also times a bare
PING so the decision's cost reads in round trips. Results go to `bench/results/` as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import redis.asyncio  # noqa: E402

from tenants.config import build_config  # noqa: E402
from tenants.ratelimit import RateLimiter  # noqa: E402
from tenants.storage import storage_from_url  # noqa: E402

TENANTS = [f"tenant-{i}" for i in range(100)]


def summarize(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000  # noqa: E731
    return {
        "p50_us": round(pick(0.50), 2),
        "p99_us": round(pick(0.99), 2),
        "mean_us": round(statistics.fmean(ordered) / 1000, 2),
        "n": len(ordered),
    }


async def timed(n: int, call: Callable[[int], Awaitable[object]]) -> dict[str, float]:
    for i in range(min(n, 1000)):  # warm-up: caches, connections, scripts
        await call(i)
    samples = []
    clock = time.perf_counter_ns
    for i in range(n):
        start = clock()
        await call(i)
        samples.append(clock() - start)
    return summarize(samples)


async def cases(limiter: RateLimiter, n: int, prefix: str) -> dict[str, dict[str, float]]:
    """Allowed hits spread over 100 tenants, refused hits on one tenant, an unlimited tenant."""
    headers = limiter.headers

    async def allowed(i: int) -> object:
        return headers(await limiter.hit(TENANTS[i % len(TENANTS)]))

    async def refused(i: int) -> object:
        return await limiter.hit("tiny")

    async def unlimited(i: int) -> object:
        return headers(await limiter.hit("vip"))

    return {
        f"{prefix} allowed (hit + headers)": await timed(n, allowed),
        f"{prefix} refused (hit)": await timed(n, refused),
        f"{prefix} unlimited tenant": await timed(n, unlimited),
    }


async def bench(n: int, redis_url: str | None) -> dict[str, dict[str, float]]:
    config = build_config(
        {
            "DEFAULT_RATE_LIMIT": "100000000req/min",
            "TENANT_RATE_LIMIT_tiny": "1req/hour",
            "TENANT_RATE_LIMIT_vip": "unlimited",
        }
    )
    results = await cases(RateLimiter(config), n, "memory")
    if redis_url:
        client = redis.asyncio.Redis.from_url(redis_url)
        await client.flushdb()
        results["redis PING (one round trip)"] = await timed(n, lambda i: client.ping())
        await client.aclose()
        limiter = RateLimiter(config, storage_from_url(redis_url))
        results.update(await cases(limiter, n, "redis"))
        await limiter.aclose()
    return results


def table(results: dict[str, dict[str, float]]) -> str:
    lines = ["| case | p50 µs | p99 µs | mean µs |", "|---|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['p50_us']} | {r['p99_us']} | {r['mean_us']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000, help="timed calls per case")
    parser.add_argument("--redis-url", help="use this Redis instead of starting one")
    parser.add_argument("--no-redis", action="store_true", help="memory only")
    args = parser.parse_args()

    if args.no_redis or args.redis_url:
        results = asyncio.run(bench(args.n, None if args.no_redis else args.redis_url))
    else:
        from tests.support.redis_server import running_redis

        with running_redis() as server:
            results = asyncio.run(bench(args.n, server.url))

    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"ratelimit-{time.strftime('%Y%m%dT%H%M%S')}.json"
    meta = {"python": platform.python_version(), "machine": platform.machine(), "n": args.n}
    path.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(table(results))
    print(f"\nwritten: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

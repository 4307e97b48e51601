"""The Retry-After bench's clients, in their own process: the trace, open loop, with returns.

    python -m bench.retryafter.client --url http://127.0.0.1:P --trace spikes \
        --capacity 3.7 --cycles 6 --seed 1 --out attempts.json

Every fresh request of the trace (`trace.py`) is sent at its time, whatever happened to the
others (open loop), as a small non-streamed chat completion with its tenant's
`X-Tenant-ID`. A client refused with 503 `queue_full` or 429 sleeps exactly its
`Retry-After` from the moment the refusal arrived and sends the same request again, up to
`MAX_RETURNS` times. Every attempt is written to `--out` as JSON (times in seconds from
the start, plus the wall-clock start) for `analysis.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict
from typing import Any

import aiohttp

from bench.retryafter import trace
from bench.retryafter.analysis import Attempt

MAX_RETURNS = 8
RETURN_ON = {(503, "queue_full"), (429, "rate_limit_exceeded")}
BODY = {
    "model": "echo",
    "messages": [{"role": "user", "content": "Say hello to the Retry-After bench."}],
    "max_tokens": 16,
}


class Clients:
    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url + "/v1/chat/completions"
        self.session = session
        self.start = 0.0
        self.attempts: list[Attempt] = []
        self.tenants: dict[int, str] = {}

    def now(self) -> float:
        return time.perf_counter() - self.start

    async def one(self, client: int, tenant: str, at: float) -> None:
        """One client: its request at `at`, then a return after each refusal's Retry-After."""
        await asyncio.sleep(max(0.0, at - self.now()))
        for attempt in range(MAX_RETURNS + 1):
            a = Attempt(client, attempt, self.now(), tenant=tenant)
            self.attempts.append(a)
            await self._send(a)
            if (a.status, a.code) not in RETURN_ON or a.retry_after is None:
                return
            await asyncio.sleep(max(0.0, a.done + a.retry_after - self.now()))

    async def _send(self, a: Attempt) -> None:
        try:
            async with self.session.post(
                self.url, json=BODY, headers={"X-Tenant-ID": a.tenant}
            ) as resp:
                body = await resp.read()
                a.done, a.status = self.now(), resp.status
                wait = resp.headers.get("X-Queue-Wait-Ms")
                if wait is not None:
                    a.queue_wait_s = int(wait) / 1e3
                retry = resp.headers.get("Retry-After")
                if retry is not None:
                    a.retry_after = int(retry)
                if resp.status != 200:
                    try:
                        a.code = str(json.loads(body)["error"]["code"])
                    except (ValueError, KeyError, TypeError):
                        a.code = "?"
        except (aiohttp.ClientError, TimeoutError) as exc:
            a.done, a.code = self.now(), type(exc).__name__


async def run(args: argparse.Namespace) -> dict[str, Any]:
    arrivals = trace.TRACES[args.trace](args.capacity, args.cycles, args.seed)
    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        clients = Clients(args.url, session)
        wall = time.time()
        clients.start = time.perf_counter()
        await asyncio.gather(
            *(clients.one(i, tenant, at) for i, (at, tenant) in enumerate(arrivals))
        )
    return {"wall_start": wall, "attempts": [asdict(a) for a in clients.attempts]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--trace", choices=sorted(trace.TRACES), required=True)
    p.add_argument("--capacity", type=float, required=True, help="engine requests per second")
    p.add_argument("--cycles", type=int, required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if not args.url.startswith("http://127.0.0.1:"):
        p.error("only http://127.0.0.1 is allowed")
    result = asyncio.run(run(args))
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

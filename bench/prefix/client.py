"""The load generator: replays a trace as streamed chat requests, and a closed-loop client.

Runs in the bench's own process (the runner and the engines are subprocesses). Every
request names its tenant in `X-Tenant-ID`, also when sent to llama-server directly (which
ignores it), so both systems receive the same bytes. Every request opens its own
connection, on both sides: llama-server's HTTP library drops kept-alive connections after
a few requests without saying so, which a pooled client sees as "server disconnected"
(measured here: 8 of 28 direct requests); a connection costs ~0.1 ms against seconds of
prompt processing.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from bench.prefix.trace import Request

MAX_TOKENS = 8
PATH = "/v1/chat/completions"


@dataclass
class Outcome:
    """What one streamed request did, as the client saw it."""

    index: int
    tenant: str
    session: str
    turn: int
    probe: bool
    sent_s: float  # since the replay started
    ttft_ms: float | None  # to the first chunk with content
    total_ms: float
    status: int
    prompt_tokens: int = 0
    cached_tokens: int = 0  # the engine's own count (timings.cache_n / usage)
    header_reused: int | None = None  # X-Cache-Tokens-Reused, when the runner answers
    completion: str = ""
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def body(model: str, req: Request) -> dict[str, Any]:
    return {
        "model": model,
        "messages": req.body_messages(),
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _cached(event: dict[str, Any]) -> int | None:
    timings = event.get("timings")
    if isinstance(timings, dict) and isinstance(timings.get("cache_n"), int):
        return int(timings["cache_n"])
    usage = event.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        return int(details["cached_tokens"])
    return None


async def stream_one(
    client: httpx.AsyncClient, url: str, model: str, req: Request, t0: float
) -> Outcome:
    """Send `req` streamed; time the first content chunk; read the engine's cache report."""
    sent = time.monotonic()
    out = Outcome(req.index, req.tenant, req.session, req.turn, req.probe, sent - t0, None, 0.0, 0)
    parts: list[str] = []
    try:
        async with client.stream(
            "POST", url + PATH, json=body(model, req), headers={"X-Tenant-ID": req.tenant}
        ) as resp:
            out.status = resp.status_code
            reused = resp.headers.get("x-cache-tokens-reused")
            out.header_reused = int(reused) if reused is not None else None
            if resp.status_code != 200:
                out.error = (await resp.aread()).decode(errors="replace")[:300]
            else:
                async for line in resp.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[6:])
                    for choice in event.get("choices") or ():
                        content = (choice.get("delta") or {}).get("content")
                        if isinstance(content, str) and content:
                            if out.ttft_ms is None:
                                out.ttft_ms = (time.monotonic() - sent) * 1e3
                            parts.append(content)
                    cached = _cached(event)
                    if cached is not None:
                        out.cached_tokens = cached
                    usage = event.get("usage")
                    if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
                        out.prompt_tokens = usage["prompt_tokens"]
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.total_ms = (time.monotonic() - sent) * 1e3
    out.completion = "".join(parts)
    return out


async def replay(url: str, model: str, trace: list[Request], concurrency: int) -> list[Outcome]:
    """Send the trace in order with `concurrency` workers; a turn waits for its session's
    previous turn to finish (it needs that answer in its history)."""
    done = {r.index: asyncio.Event() for r in trace}
    results: list[Outcome] = []
    pending = list(trace)
    lock = asyncio.Lock()
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    timeout = httpx.Timeout(600.0, connect=10.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:

        async def worker() -> None:
            while True:
                async with lock:
                    if not pending:
                        return
                    req = pending.pop(0)
                if req.after is not None:
                    await done[req.after].wait()
                results.append(await stream_one(client, url, model, req, t0))
                done[req.index].set()

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sorted(results, key=lambda o: o.index)


def short_messages(client_no: int, k: int) -> list[dict[str, str]]:
    """Client `client_no`'s k-th short request (the same on both sides of a pair)."""
    return [
        {
            "role": "user",
            "content": f"Client {client_no}, question {k}: name one colour of the sea, briefly.",
        }
    ]


async def closed_loop(
    url: str, model: str, clients: int, tenants: int, duration_s: float, first_k: int = 0
) -> dict[str, Any]:
    """`clients` clients, each sending its next short JSON request as soon as the last one
    answered, for `duration_s`; requests that finish after the window are not counted.
    Requests are numbered from `first_k`: a pair's two runs send the same ones, and each
    pair new ones, so no run is served from an earlier run's cache."""
    t0 = time.monotonic()
    end = t0 + duration_s
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0)) as client:

        async def one_client(i: int) -> None:
            nonlocal errors
            k = first_k
            while time.monotonic() < end:
                payload = {
                    "model": model,
                    "messages": short_messages(i, k),
                    "max_tokens": MAX_TOKENS,
                    "temperature": 0,
                }
                sent = time.monotonic()
                try:
                    r = await client.post(
                        url + PATH, json=payload, headers={"X-Tenant-ID": f"tenant-{i % tenants}"}
                    )
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                now = time.monotonic()
                if now <= end:
                    if ok:
                        latencies.append((now - sent) * 1e3)
                    else:
                        errors += 1
                k += 1

        await asyncio.gather(*(one_client(i) for i in range(clients)))
    return {
        "requests": len(latencies),
        "errors": errors,
        "duration_s": duration_s,
        "rps": len(latencies) / duration_s,
        "latencies_ms": latencies,
    }

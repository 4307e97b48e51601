"""Streaming client for P3: time to first chunk and to the end of each SSE stream.

    python -m bench.proxy.ttfb --url http://127.0.0.1:P/v1/chat/completions \
        --concurrency 16 --duration 8  < body.json

`concurrency` workers, each on one keep-alive HTTP/1.1 connection, send the body (stdin)
again and again until `duration` seconds have passed. Per request it times, from the moment
the request is written: the first body chunk holding an SSE `data:` event (TTFB) and the
end of the response. It also counts SSE events per response, so a proxy that drops or merges
events shows up as a different count. Prints one line `BENCH_JSON {...}` (times in us).

It is a plain asyncio client (uvloop when present), so it is slower than wrk; it is only
used at 16 concurrent streams (~130 req/s), where it is far from saturated, and the same
client measures both sides.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from urllib.parse import urlsplit


class Sample:
    __slots__ = ("end", "events", "first", "ok")

    def __init__(self) -> None:
        self.first = 0.0
        self.end = 0.0
        self.events = 0
        self.ok = False


async def _one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes) -> Sample:
    s = Sample()
    t0 = time.perf_counter()
    writer.write(req)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    if b"transfer-encoding: chunked" not in lower:
        raise RuntimeError(f"expected a chunked streamed answer, got:\n{head.decode()}")
    while True:
        line = await reader.readline()
        size = int(line.split(b";", 1)[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # end of the (empty) trailer section
            break
        data = await reader.readexactly(size + 2)
        n = data.count(b"data: ")
        if n and not s.first:
            s.first = time.perf_counter() - t0
        s.events += n
    s.end = time.perf_counter() - t0
    s.ok = status == 200
    return s


async def _worker(
    host: str, port: int, req: bytes, deadline: float, out: list[Sample], errors: list[str]
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < deadline:
            try:
                async with asyncio.timeout(10):
                    out.append(await _one(reader, writer, req))
            except (OSError, asyncio.IncompleteReadError, RuntimeError, ValueError) as exc:
                errors.append(repr(exc))
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
    finally:
        writer.close()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


async def main(url: str, concurrency: int, duration: float, body: bytes) -> dict[str, object]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    req = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Content-Type: application/json\r\nX-Tenant-ID: bench-tenant\r\n"
        f"X-Priority: normal\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    samples: list[Sample] = []
    errors: list[str] = []
    deadline = time.perf_counter() + duration
    await asyncio.gather(
        *(_worker(host, port, req, deadline, samples, errors) for _ in range(concurrency))
    )
    good = [s for s in samples if s.ok]
    first = [s.first * 1e6 for s in good]
    end = [s.end * 1e6 for s in good]
    events = sorted({s.events for s in good})
    return {
        "requests": len(good),
        "errors": len(errors) + len(samples) - len(good),
        "error_examples": errors[:3],
        "ttfb_p50_us": round(_pct(first, 50)),
        "ttfb_p99_us": round(_pct(first, 99)),
        "total_p50_us": round(_pct(end, 50)),
        "total_p99_us": round(_pct(end, 99)),
        "events_per_response": events,
    }


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=8.0)
    args = p.parse_args()
    body = sys.stdin.buffer.read()
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(main(args.url, args.concurrency, args.duration, body))
    else:
        result = uvloop.run(main(args.url, args.concurrency, args.duration, body))
    sys.stdout.write("BENCH_JSON " + json.dumps(result) + "\n")


if __name__ == "__main__":
    cli()

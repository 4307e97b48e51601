"""The runner in front of the real vLLM (CPU build, scripts/install-vllm) against vLLM alone.

    .venv/bin/python -m bench.vllm.run [--pairs 3] [--duration 60] [--clients 4,16]
        [--prefix-reps 2] [--no-throughput] [--no-prefix]

One `vllm serve` (the default models file's Gemma 3 270M and CPU flags, dev mode, no API
key) serves both systems: "direct" is that engine; "runner" is `python -m runner` with the
engine attached by URL, so it salts every request per tenant (`cache_salt`) as it does for
the engines it starts. Same engine, same bytes from the clients; only the path differs.

1. Throughput and TTFT: for each client count, `--pairs` interleaved pairs (R D, D R, ...)
   of closed-loop runs, `--duration` s each: every client streams a short chat
   (`max_tokens` 8) and sends its next one when the last ended; a pair's two runs send the
   same requests, each pair new ones. Reported: completed requests/s, TTFT p50/p95 (first
   chunk with content), runner ÷ direct per pair (median [min, max]), over the pairs in
   which both sides finished a request; a measure no pair finished a request for reads
   "no request finished" (a CPU build under load can finish none in a short run: 60 s a
   side by default).
2. Prefix reuse: the multi-tenant, multi-turn trace of bench/prefix (4 tenants, private
   system prompts, probes sending another tenant's prompt) replayed `--prefix-reps` times
   per system, interleaved, the engine's prefix cache reset before each replay. Reported:
   tokens reused (the engine's `cached_tokens`), probes' reused tokens (cross-tenant: the
   runner's must be 0), TTFT p50; runner ÷ direct.
Writes `bench/results/vllm-<time>.json` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from adapters.supervisor import free_port
from bench.prefix.client import replay
from bench.prefix.trace import TraceConfig, build_trace
from bench.proxy.procs import REPO_ROOT, loadavg, machine_facts

MODEL = "gemma-3-270m-vllm"
MAX_TOKENS = 8
NONE_FINISHED = "no request finished"


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _default_entry() -> dict[str, Any]:
    models = yaml.safe_load((REPO_ROOT / "models.yaml").read_text())["models"]
    entry: dict[str, Any] = next(m for m in models if m["id"] == MODEL)
    return entry


def _wait_ok(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer 200 within {timeout} s")


@contextmanager
def engine(slots: int) -> Iterator[str]:
    """`vllm serve` with the default models file's entry (no API key, dev mode)."""
    entry = _default_entry()
    port = free_port()
    scratch = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    (scratch / "cache").mkdir()
    (scratch / "tmp").mkdir()
    argv = [
        str(Path(entry["bin"]).expanduser()),
        "serve",
        str(Path(entry["path"]).expanduser()),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        MODEL,
        "--max-model-len",
        str(entry["context_length"]),
        "--max-num-seqs",
        str(slots),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--enable-per-request-metrics",
        *entry["args"],
    ]
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(scratch / "cache"),
        "TMPDIR": str(scratch / "tmp"),
    }
    log = open(scratch / "engine.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ok(url + "/health", 600)
        yield url
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()


@contextmanager
def runner(engine_url: str, slots: int) -> Iterator[str]:
    """`python -m runner` with the engine attached by URL (tenants salted)."""
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="bench-vllm-runner-"))
    models = tmp / "models.yaml"
    models.write_text(
        yaml.safe_dump(
            {"models": [{"id": MODEL, "backend": "vllm", "url": engine_url, "parallel": slots}]}
        )
    )
    env = {
        **os.environ,
        "PORT": str(port),
        "HOST": "127.0.0.1",
        "MODELS_CONFIG": str(models),
        "LOG_LEVEL": "warning",
        "MAX_QUEUE_DEPTH": "4096",
    }
    with open(tmp / "runner.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runner"], cwd=REPO_ROOT, env=env, stdout=log, stderr=log
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ok(url + "/health", 120)
            yield url
        finally:
            proc.terminate()
            proc.wait(30)


async def _stream_loop(
    url: str, clients: int, duration_s: float, first_k: int, stream: bool = True
) -> dict[str, Any]:
    """Closed loop of short chats (streamed, or whole JSON answers when `stream` is False);
    requests ending after the window do not count. A JSON answer's "TTFT" is its latency."""
    t0 = time.monotonic()
    end = t0 + duration_s
    ttfts: list[float] = []
    done = 0
    errors = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300.0)) as client:

        async def one(i: int) -> None:
            nonlocal done, errors
            k = first_k
            while time.monotonic() < end:
                body = {
                    "model": MODEL,
                    "messages": [
                        {"role": "user", "content": f"Client {i}, question {k}: name a colour."}
                    ],
                    "max_tokens": MAX_TOKENS,
                    "temperature": 0,
                    "stream": stream,
                }
                sent = time.monotonic()
                first: float | None = None
                ok = False
                try:
                    async with client.stream(
                        "POST",
                        url + "/v1/chat/completions",
                        json=body,
                        headers={"X-Tenant-ID": f"tenant-{i % 4}"},
                    ) as r:
                        async for line in r.aiter_lines():
                            if first is None and (not stream or _has_content(line)):
                                first = time.monotonic()
                        ok = r.status_code == 200
                        first = first if stream else time.monotonic()
                except httpx.HTTPError:
                    ok = False
                now = time.monotonic()
                if now <= end:
                    if ok:
                        done += 1
                        if first is not None:
                            ttfts.append((first - sent) * 1e3)
                    else:
                        errors += 1
                k += 1

        await asyncio.gather(*(one(i) for i in range(clients)))
    return {"rps": done / duration_s, "requests": done, "errors": errors, "ttft_ms": ttfts}


def _has_content(line: str) -> bool:
    """A streamed event carrying generated text (not the role chunk's empty content)."""
    return line.startswith("data: {") and '"content":"' in line and '"content":""' not in line


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


def _ratio_summary(ratios: list[float]) -> str:
    """Median [min, max] of the finite ratios; `NONE_FINISHED` when there are none."""
    kept = [r for r in ratios if math.isfinite(r)]
    if not kept:
        return NONE_FINISHED
    return f"{statistics.median(kept):.3f} [{min(kept):.3f}, {max(kept):.3f}]"


def _ratios(runner: list[float], direct: list[float]) -> list[float]:
    """runner ÷ direct per pair, for the pairs where both are finite and direct is not 0."""
    return [
        a / b
        for a, b in zip(runner, direct, strict=True)
        if math.isfinite(a) and math.isfinite(b) and b
    ]


def _median(values: list[float], digits: int) -> str:
    """The median of the finite values, `digits` after the point; `NONE_FINISHED` if none."""
    kept = [v for v in values if math.isfinite(v)]
    return f"{statistics.median(kept):.{digits}f}" if kept else NONE_FINISHED


async def _reset(engine_url: str) -> None:
    async with httpx.AsyncClient() as c:
        r = await c.post(engine_url + "/reset_prefix_cache", timeout=30)
        r.raise_for_status()


def parser() -> argparse.ArgumentParser:
    """The command line (defaults: 3 pairs of 60 s a side, 4 and 16 clients)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds per side per pair")
    ap.add_argument("--clients", default="4,16")
    ap.add_argument("--modes", default="stream,json", help="streamed and/or JSON chats")
    ap.add_argument("--slots", type=int, default=16, help="--max-num-seqs and the runner's slots")
    ap.add_argument("--prefix-reps", type=int, default=2)
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument("--no-prefix", action="store_true")
    return ap


def main() -> None:
    ap = parser()
    args = ap.parse_args()
    results: dict[str, Any] = {"machine": machine_facts(), "args": vars(args)}
    _log("starting vLLM (default models file's entry)")
    with engine(args.slots) as direct, runner(direct, args.slots) as through:
        systems = {"runner": through, "direct": direct}
        if not args.no_throughput:
            tp: dict[str, Any] = {}
            cases = [(int(c), m) for m in args.modes.split(",") for c in args.clients.split(",")]
            for clients, mode in cases:
                stream = mode == "stream"
                asyncio.run(_stream_loop(direct, clients, 5.0, 10_000, stream))  # warm-up
                pairs = []
                for p in range(args.pairs):
                    order = ["runner", "direct"] if p % 2 == 0 else ["direct", "runner"]
                    pair: dict[str, Any] = {}
                    for name in order:
                        asyncio.run(_reset(direct))
                        run = asyncio.run(
                            _stream_loop(systems[name], clients, args.duration, p * 100_000, stream)
                        )
                        run["load"] = loadavg()
                        pair[name] = run
                        _log(f"{clients} clients {mode} pair {p} {name}: {_run_line(run)}")
                    pairs.append(pair)
                tp[str(clients) if stream else f"{clients} JSON"] = pairs
            results["throughput"] = tp
        if not args.no_prefix:
            trace = build_trace(TraceConfig())
            runs: list[dict[str, Any]] = []
            for rep in range(args.prefix_reps):
                order = ["runner", "direct"] if rep % 2 == 0 else ["direct", "runner"]
                for name in order:
                    asyncio.run(_reset(direct))
                    outcomes = asyncio.run(replay(systems[name], MODEL, trace, 4))
                    chat = [o for o in outcomes if not o.probe]
                    probes = [o for o in outcomes if o.probe]
                    ttft = [o.ttft_ms for o in chat if o.ttft_ms is not None]
                    run = {
                        "system": name,
                        "rep": rep,
                        "errors": sum(o.status != 200 or o.error is not None for o in outcomes),
                        "reused_tokens": sum(o.cached_tokens for o in chat),
                        "prompt_tokens": sum(o.prompt_tokens for o in chat),
                        "probe_reused_tokens": sum(o.cached_tokens for o in probes),
                        "probes": len(probes),
                        "ttft_p50_ms": _pct(ttft, 50),
                        "ttft_p95_ms": _pct(ttft, 95),
                        "load": loadavg(),
                    }
                    runs.append(run)
                    _log(f"prefix {name} rep {rep}: {json.dumps(run)}")
            results["prefix"] = runs
    out = REPO_ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"vllm-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=1))
    print(report(results))
    _log(f"wrote {path}")


def _run_line(run: dict[str, Any]) -> str:
    """One run's log line: its rate and TTFT, or that it finished no request."""
    if not run["requests"]:
        return f"{NONE_FINISHED} ({run['errors']} failed)"
    return f"{run['rps']:.2f} req/s, TTFT p50 {_pct(run['ttft_ms'], 50):.0f} ms"


def _rate(run: dict[str, Any]) -> float:
    """A run's completed requests/s; NaN when it finished none (no rate to compare)."""
    return float(run["rps"]) if run["requests"] else math.nan


def report(results: dict[str, Any]) -> str:
    """The Markdown table; a measure no run finished a request for says so."""
    lines = [
        "| measure | runner ÷ direct, median [min, max] | runner | direct |",
        "|---|---|---|---|",
    ]
    for clients, pairs in results.get("throughput", {}).items():
        rows = [
            ("throughput", "req/s", 2, [(_rate(p["runner"]), _rate(p["direct"])) for p in pairs])
        ]
        for q in (50, 95):
            ttft = [
                (_pct(p["runner"]["ttft_ms"], q), _pct(p["direct"]["ttft_ms"], q)) for p in pairs
            ]
            rows.append((f"{'latency' if 'JSON' in clients else 'TTFT'} p{q}", "ms", 0, ttft))
        for label, unit, digits, values in rows:
            runner = [r for r, _ in values]
            direct = [d for _, d in values]
            lines.append(
                f"| {label}, {clients} clients ({unit}) | "
                f"{_ratio_summary(_ratios(runner, direct))} | "
                f"{_median(runner, digits)} | {_median(direct, digits)} |"
            )
    runs = results.get("prefix", [])
    if runs:
        by = {s: [r for r in runs if r["system"] == s] for s in ("runner", "direct")}

        def med(system: str, key: str) -> float:
            return float(statistics.median(r[key] for r in by[system]))

        for key, label in (
            ("reused_tokens", "prefix: tokens reused, same tenant"),
            ("probe_reused_tokens", "prefix: tokens reused by probes (cross-tenant)"),
            ("ttft_p50_ms", "prefix: TTFT p50 (ms)"),
            ("errors", "errors"),
        ):
            r, d = med("runner", key), med("direct", key)
            ratio = f"{r / d:.3f}" if d else "-"
            lines.append(f"| {label} | {ratio} | {r:.0f} | {d:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

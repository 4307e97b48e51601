"""What STATE_DB (spent nonces in SQLite, fsynced before the 200) adds to a governed
lifecycle call, against nonces in memory (STATE_DB=memory).

    .venv/bin/python bench/state/run.py [--calls 2000] [--http 300] [--no-docs]

Two measurements, each interleaved (memory and SQLite call by call, so both see the same
machine load):

1. In process: `Verifier.authorize` on distinct pre-signed 2-of-3 tokens (signing not
   timed), one verifier with a `MemoryNonceStore`, one with a `SqliteNonceStore` on a
   file in a temporary folder per sync mode (full, normal); memory audit for all; and one
   4 KiB write + fsync of a plain file between the calls (the disk's own commit cost).
2. Through HTTP: `POST /v1/cache/flush` with a fresh dev token on two runner processes
   (the fake OpenAI engine attached by URL; `STATE_DB=memory` vs a file), timed by the
   client from send to the answer.

Writes bench/results/state-<time>.json and the "## State that survives (issue 37)" section
of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from governance.audit import MemoryAuditSink  # noqa: E402
from governance.nonces import MemoryNonceStore, SqliteNonceStore  # noqa: E402
from governance.registry import parse_registry  # noqa: E402
from governance.verifier import Verifier  # noqa: E402
from tests.fixtures.launch import start_fake  # noqa: E402
from tests.support.runner_proc import start_runner  # noqa: E402
from tests.support.tokens import DEV_REGISTRY, dev_token  # noqa: E402

_spec = importlib.util.spec_from_file_location("governance_bench", ROOT / "bench/governance/run.py")
assert _spec is not None and _spec.loader is not None
gov = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gov)  # its tokens, registry and percentiles: the same calls

NOW = 1_767_225_600
COMMAND = ".venv/bin/python bench/state/run.py"
SECTION = "## State that survives (issue 37)"


async def in_process(calls: int, folder: Path) -> dict[str, dict[str, float]]:
    registry = parse_registry(gov.registry_json())
    verifiers = {
        "memory": Verifier(
            registry, MemoryNonceStore(lambda: NOW), MemoryAuditSink(), gov.RUNNER, lambda: NOW
        ),
        **{
            f"sqlite {sync}": Verifier(
                registry,
                SqliteNonceStore(folder / f"state-{sync}.sqlite3", lambda: NOW, sync),
                MemoryAuditSink(),
                gov.RUNNER,
                lambda: NOW,
            )
            for sync in ("full", "normal")
        },
    }
    tokens = {name: gov.make_tokens(calls + 100) for name in verifiers}
    samples: dict[str, list[int]] = {name: [] for name in (*verifiers, "fsync")}
    with open(folder / "fsync.bin", "wb") as disk:
        for i in range(calls + 100):
            for name, verifier in verifiers.items():
                start = time.perf_counter_ns()
                await verifier.authorize(tokens[name][i], "model-load", gov.MODEL, dict(gov.PARAMS))
                if i >= 100:  # warm-up not counted
                    samples[name].append(time.perf_counter_ns() - start)
            start = time.perf_counter_ns()  # the disk's own cost: one 4 KiB write + fsync
            disk.write(b"\0" * 4096)
            disk.flush()
            os.fsync(disk.fileno())
            if i >= 100:
                samples["fsync"].append(time.perf_counter_ns() - start)
    for verifier in verifiers.values():
        await verifier.aclose()
    return {name: gov.percentiles(s) for name, s in samples.items()}


def through_http(calls: int, folder: Path) -> dict[str, dict[str, float]]:
    base = {"GOVERNANCE_REGISTRY": str(DEV_REGISTRY), "LIFECYCLE_RATE_LIMIT": "100000/minute"}
    settings = {
        "memory": {**base, "STATE_DB": "memory"},
        **{
            f"sqlite {sync}": {
                **base,
                "STATE_DB": str(folder / f"http-{sync}.sqlite3"),
                "STATE_DB_SYNC": sync,
            }
            for sync in ("full", "normal")
        },
    }
    samples: dict[str, list[int]] = {name: [] for name in settings}
    with ExitStack() as stack:
        engine = stack.enter_context(start_fake("fake_openai", "--latency-ms", "0"))
        urls = {
            name: stack.enter_context(start_runner({"echo": engine.url}, env=env)).url
            for name, env in settings.items()
        }
        with httpx.Client(timeout=30) as client:
            for i in range(calls + 20):
                for name, url in urls.items():
                    token = dev_token("cache-flush", None, {"scope": "all"})
                    body = {"scope": "all", "verifiedOpToken": token}
                    start = time.perf_counter_ns()
                    answer = client.post(url + "/v1/cache/flush", json=body)
                    elapsed = time.perf_counter_ns() - start
                    assert answer.status_code == 200, answer.text
                    if i >= 20:
                        samples[name].append(elapsed)
    return {name: gov.percentiles(s) for name, s in samples.items()}


def markdown(result: dict[str, Any]) -> str:
    rows = [
        "| measurement | store | n | p50 µs | p90 µs | p99 µs | mean µs |",
        "|---|---|---|---|---|---|---|",
    ]
    added = []
    for what, label in (("in_process", "Verifier.authorize"), ("http", "POST /v1/cache/flush")):
        figures = result[what]
        for store, r in figures.items():
            row = "4 KiB write + fsync alone" if store == "fsync" else label
            rows.append(
                f"| {row} | {store} | {r['n']} | {r['p50_us']:.0f} | {r['p90_us']:.0f} | "
                f"{r['p99_us']:.0f} | {r['mean_us']:.0f} |"
            )
        for sync in ("full", "normal"):
            p50 = (figures[f"sqlite {sync}"]["p50_us"] - figures["memory"]["p50_us"]) / 1000
            p90 = (figures[f"sqlite {sync}"]["p90_us"] - figures["memory"]["p90_us"]) / 1000
            added.append(f"{label}, {sync}: {p50:+.2f} ms at p50, {p90:+.2f} ms at p90")
    m = result["machine"]
    return "\n".join(
        [
            SECTION,
            "",
            f"Command: `{COMMAND}` (about a minute). It writes `bench/results/state-<time>.json`",
            "(gitignored) and rewrites this section.",
            "",
            "What a governed lifecycle call pays for its spent nonce being durable before the",
            "200 (`STATE_DB`, SQLite in WAL mode with `synchronous=FULL`: one commit and one",
            "fsync of the WAL per call, in a worker thread) against nonces kept in memory",
            "(`STATE_DB=memory`), and the same with `STATE_DB_SYNC=normal` (no fsync per",
            "commit: a SIGKILL still loses nothing, a power cut may lose the last commits).",
            "Memory and SQLite calls alternate one by one, so all see",
            "the same machine load. In process: `Verifier.authorize` on distinct 2-of-3 tokens",
            "(memory audit; signing not timed). Through HTTP: `POST /v1/cache/flush` with a",
            "fresh dev token on three runner processes in front of the fake engine, timed by the",
            "client. The data path does not touch STATE_DB. The fsync row is the disk's own",
            "cost of one commit, timed between the calls.",
            "",
            f"Measured {result['date']} on Python {m['python']}, {m['machine']}, {m['cpus']} "
            f"vCPU, load average {m['loadavg']:.2f} before the run.",
            "",
            *rows,
            "",
            "Added by SQLite: " + "; ".join(added) + ". Target: ≤ +2 ms.",
            "With `full` the added latency is about one fsync of the disk (compare the fsync",
            "row): it meets the target on a disk whose fsync takes under ~1.5 ms, and on",
            "slower storage (a busy shared disk, network volumes) it is that storage's commit",
            "latency; `normal` takes the fsync off the call.",
            "",
        ]
    )


def write_section(text: str) -> None:
    path = ROOT / "docs" / "benchmarks.md"
    current = path.read_text()
    start = current.find(SECTION)
    if start == -1:
        updated = current.rstrip("\n") + "\n\n" + text
    else:
        end = current.find("\n## ", start + len(SECTION))
        tail = "" if end == -1 else current[end + 1 :]
        updated = current[:start] + text + ("\n" + tail if tail else "")
    path.write_text(updated)


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--http", type=int, default=300)
    parser.add_argument("--no-docs", action="store_true", help="do not touch docs/benchmarks.md")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        result = {
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "command": COMMAND,
            "machine": {
                "python": platform.python_version(),
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "loadavg": load_before,
            },
            "in_process": await in_process(args.calls, folder),
            "http": await asyncio.to_thread(through_http, args.http, folder),
        }
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"state-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.json"
    out.write_text(json.dumps(result, indent=2))
    table = markdown(result)
    print(table)
    print(f"wrote {out}")
    if not args.no_docs:
        write_section(table)


if __name__ == "__main__":
    asyncio.run(main())

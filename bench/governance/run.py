"""Verify cost of a 2-of-3 op token, nonce consume and audit included, memory vs real Redis.

    .venv/bin/python bench/governance/run.py [--tokens 3000]

Pre-signs N distinct tokens (signing is not timed), then times each `Verifier.authorize`
call: steps 0-7, i.e. parse, two Ed25519 checks, threshold, binding, time, nonce consume,
audit append. Scenarios: memory nonce store + memory audit; real Redis (a redis-server
started here on a free loopback port) + memory audit; memory + file audit (fsync per
record). Also times the signature checks alone via PyJWT vs cryptography, which is why the
verifier calls cryptography directly. Writes bench/results/governance-<time>.json and the
Markdown table into the "## Governance (P7)" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import cryptography  # noqa: E402
import jwt  # noqa: E402
from jwt.api_jws import PyJWS  # noqa: E402

from governance import signing  # noqa: E402
from governance.audit import AuditSink, FileAuditSink, MemoryAuditSink  # noqa: E402
from governance.encoding import b64url_decode  # noqa: E402
from governance.nonces import MemoryNonceStore, NonceStore, RedisNonceStore  # noqa: E402
from governance.registry import parse_registry  # noqa: E402
from governance.verifier import Verifier  # noqa: E402
from tests.support.redis_server import running_redis  # noqa: E402

NOW = 1_767_225_600
RUNNER = "runner-bench"
PARAMS = {"quantization": "awq-4bit", "maxContextLength": 32768}
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
KEYS = [signing.generate_key(bytes([i]) * 32) for i in (1, 2, 3)]
COMMAND = ".venv/bin/python bench/governance/run.py"
SECTION = "## Governance (P7)"


def registry_json() -> str:
    names = ["admin1", "admin2", "admin3"]
    return json.dumps(
        {
            "issuer": "gov-bench",
            "policyEpoch": 1,
            "expires": "2099-01-01T00:00:00Z",
            "principals": {
                n: [signing.public_key_b64(k)] for n, k in zip(names, KEYS, strict=True)
            },
            "operations": {"model-load": {"threshold": 2, "principals": names}},
        }
    )


def make_tokens(count: int) -> list[str]:
    tokens = []
    for i in range(count):
        proposal = signing.propose(
            operation="model-load",
            model_id=MODEL,
            params=PARAMS,
            aud=RUNNER,
            iss="gov-bench",
            issued_at=NOW,
        )
        pair = (KEYS[i % 3], KEYS[(i + 1) % 3])
        tokens.append(signing.to_b64(signing.combine(signing.sign(proposal, k) for k in pair)))
    return tokens


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000

    return {
        "n": len(ordered),
        "p50_us": pick(0.50),
        "p90_us": pick(0.90),
        "p99_us": pick(0.99),
        "mean_us": statistics.fmean(ordered) / 1000,
        "max_us": ordered[-1] / 1000,
    }


async def run_scenario(nonces: NonceStore, audit: AuditSink, tokens: list[str]) -> dict[str, float]:
    verifier = Verifier(parse_registry(registry_json()), nonces, audit, RUNNER, lambda: NOW)
    for raw in tokens[:200]:  # warm-up (caches, connection)
        await verifier.authorize(raw, "model-load", MODEL, dict(PARAMS))
    samples = []
    for raw in tokens[200:]:
        start = time.perf_counter_ns()
        await verifier.authorize(raw, "model-load", MODEL, dict(PARAMS))
        samples.append(time.perf_counter_ns() - start)
    await verifier.aclose()
    return percentiles(samples)


def signature_only(tokens: list[str]) -> dict[str, dict[str, float]]:
    """The two signature checks alone: PyJWT's api_jws.decode vs cryptography directly."""
    jws = PyJWS(algorithms=["EdDSA"])
    publics = {signing.kid_of(k): k.public_key() for k in KEYS}
    entries = []
    for raw in tokens[:2000]:
        doc = json.loads(b64url_decode(raw))
        for e in doc["signatures"]:
            kid = json.loads(b64url_decode(e["protected"]))["kid"]
            entries.append((f"{e['protected']}.{doc['payload']}", e["signature"], publics[kid]))
    out = {}
    for name in ("pyjwt", "cryptography"):
        samples = []
        for i in range(0, len(entries) - 1, 2):
            start = time.perf_counter_ns()
            for signing_input, sig, key in entries[i : i + 2]:
                if name == "pyjwt":
                    jws.decode(f"{signing_input}.{sig}", key=key, algorithms=["EdDSA"])
                else:
                    key.verify(b64url_decode(sig), signing_input.encode("ascii"))
            samples.append(time.perf_counter_ns() - start)
        out[name] = percentiles(samples)
    return out


def markdown(result: dict[str, Any]) -> str:
    rows = [
        "| scenario | n | p50 µs | p90 µs | p99 µs | mean µs |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in result["scenarios"].items():
        rows.append(
            f"| {name} | {r['n']} | {r['p50_us']:.0f} | {r['p90_us']:.0f} | "
            f"{r['p99_us']:.0f} | {r['mean_us']:.0f} |"
        )
    sig = result["signature_checks_only"]
    for name, r in sig.items():
        rows.append(
            f"| 2 signature checks only, {name} | {r['n']} | {r['p50_us']:.0f} | "
            f"{r['p90_us']:.0f} | {r['p99_us']:.0f} | {r['mean_us']:.0f} |"
        )
    m = result["machine"]
    verdicts = []
    targets = {"memory nonces + memory audit": 500, "Redis nonces + memory audit": 1500}
    for name, target_us in targets.items():
        r = result["scenarios"][name]
        ok = r["p99_us"] <= target_us
        verdicts.append(f"{name}: p99 {'meets' if ok else 'MISSES'} {target_us} µs")
    return "\n".join(
        [
            SECTION,
            "",
            f"Command: `{COMMAND}` (about 10 s). It writes `bench/results/governance-<time>.json`",
            "(gitignored) and rewrites this section.",
            "",
            "What is timed: one `Verifier.authorize` call on a distinct, valid 2-of-3 token",
            "in its base64url form, from the raw string to the returned Approval: strict",
            "parsing, two Ed25519 signature checks, threshold, binding, time window, nonce",
            "consume and the audit append. Signing is not timed. 200 warm-up calls per scenario",
            "are not counted. Redis is a real redis-server on loopback, started by the bench",
            "(one round trip per call).",
            "",
            f"Measured {result['date']} on Python {m['python']}, {m['machine']}, {m['cpus']} vCPU, "
            f"cryptography {m['cryptography']}, PyJWT {m['pyjwt']}, "
            f"load average {m['loadavg']:.2f} before the run.",
            "",
            *rows,
            "",
            "Targets (issue 3, PERFORMANCE.md P7): p99 ≤ 500 µs with the memory store, "
            "p99 ≤ 1500 µs with Redis. This run: " + "; ".join(verdicts) + ".",
            "Two Ed25519 verifications are ~210 µs of the memory figure; the loopback Redis",
            "round trip through redis-py adds 85-200 µs at p50. Figures vary from run to run",
            "on this shared 2-vCPU VM (redis-server and the bench share both cores, and other",
            "work may run): across the runs made while writing this bench, memory p50 was",
            "267-423 µs and Redis p50 434-636 µs, with p99 from under 1 ms to several ms. The",
            "load average before the run is recorded above; compare runs at low load.",
            "The file-audit row adds one `write` + `fsync` per record in a worker thread; its",
            "cost is the disk's.",
            "The signature-only rows are why the verifier checks Ed25519 with `cryptography`",
            "directly instead of through `jwt.api_jws.decode` (same signing input and verdicts,",
            "pinned by `tests/governance/test_pyjwt_agreement.py`).",
            "",
        ]
    )


def write_section(text: str) -> None:
    path = ROOT / "docs" / "benchmarks.md"
    current = path.read_text() if path.exists() else "# Benchmarks\n"
    start = current.find(SECTION)
    if start == -1:
        updated = current.rstrip("\n") + "\n\n" + text
    else:
        end = current.find("\n## ", start + len(SECTION))
        tail = "" if end == -1 else current[end + 1 :]
        updated = current[:start] + text + ("\n" + tail if tail else "")
    path.write_text(updated)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--no-docs", action="store_true", help="do not touch docs/benchmarks.md")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    count = args.tokens + 200
    print(f"signing {3 * count} tokens ...", flush=True)
    scenarios: dict[str, dict[str, float]] = {}
    tokens = make_tokens(count)
    scenarios["memory nonces + memory audit"] = await run_scenario(
        MemoryNonceStore(lambda: NOW), MemoryAuditSink(), tokens
    )
    with running_redis() as redis:  # a throwaway redis-server, as the tests use
        tokens = make_tokens(count)
        scenarios["Redis nonces + memory audit"] = await run_scenario(
            RedisNonceStore.from_url(redis.url), MemoryAuditSink(), tokens
        )
    with tempfile.TemporaryDirectory() as tmp:
        tokens = make_tokens(count)
        scenarios["memory nonces + file audit (fsync)"] = await run_scenario(
            MemoryNonceStore(lambda: NOW), FileAuditSink(Path(tmp) / "audit.jsonl"), tokens
        )
    result = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": COMMAND,
        "machine": {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "cryptography": cryptography.__version__,
            "pyjwt": jwt.__version__,
            "loadavg": load_before,
        },
        "scenarios": scenarios,
        "signature_checks_only": signature_only(tokens),
    }
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"governance-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.json"
    out.write_text(json.dumps(result, indent=2))
    table = markdown(result)
    print(table)
    print(f"wrote {out}")
    if not args.no_docs:
        write_section(table)


if __name__ == "__main__":
    asyncio.run(main())

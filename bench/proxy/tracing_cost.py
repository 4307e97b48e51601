"""What tracing costs on the data path: one runner with tracing off, one on at 100% and one
at 10% sampling, against the same fake engine, in one run.

    .venv/bin/python -m bench.proxy.tracing_cost [--duration 5] [--reps 3] [--clients 16]

The three runners (this tree's code) export to an OTLP/HTTP receiver on loopback
(tests/support/otlp_receiver.py, decoding every span as a collector would). For each of
`--reps` rounds, one `wrk` run of JSON chats per runner, the order rotating per round
(off, 100%, 10%; 100%, 10%, off; ...) so that the machine's drift hits all alike. Prints
each side's median requests per second and p50 with [min, max], and the on sides' ratio
to off within each round (median). Tracing off against main is `bench.proxy.compare` and
`bench.proxy.instructions` (docs/benchmarks.md, "Tracing").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from typing import Any

from bench.proxy.loadgen import run_wrk
from bench.proxy.procs import FEATURES_ON, start_runner
from bench.proxy.run import BODIES, CHUNK_DELAY_MS, CHUNKS, LATENCY_MS, PATH
from tests.fixtures.launch import start_fake
from tests.support.otlp_receiver import otlp_receiver

SIDES = {
    "off": {},
    "on 100%": {"OTEL_TRACES_SAMPLER": "always_on"},
    "on 10%": {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args(argv)
    body = json.dumps(BODIES["json"]).encode()
    fake = ["--latency-ms", str(LATENCY_MS), "--chunks", str(CHUNKS)]
    fake += ["--chunk-delay-ms", str(CHUNK_DELAY_MS)]
    rounds: list[dict[str, dict[str, Any]]] = []
    with contextlib.ExitStack() as stack:
        receiver = stack.enter_context(otlp_receiver())
        engine = stack.enter_context(start_fake("fake_openai", *fake))
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}
        urls = {}
        for side, extra in SIDES.items():
            env = {**FEATURES_ON, **(dict(otel, **extra) if side != "off" else {})}
            urls[side] = stack.enter_context(start_runner(engine.url, 64, env=env)).url + PATH
        for url in urls.values():  # warm-up
            run_wrk(url, body, args.clients, 2)
        names = list(SIDES)
        for rep in range(args.reps):
            order = names[rep % 3 :] + names[: rep % 3]
            rounds.append(
                {side: run_wrk(urls[side], body, args.clients, args.duration) for side in order}
            )
            said = ", ".join(
                f"{s} {r['rps']:.0f} req/s p50 {r['lat_p50_us'] / 1000:.2f} ms"
                for s, r in rounds[-1].items()
            )
            print(f"round {rep + 1}: {said}", file=sys.stderr)
        print(f"spans received: {len(receiver.spans)}", file=sys.stderr)
    for side in names:
        rps = [r[side]["rps"] for r in rounds]
        p50 = [r[side]["lat_p50_us"] / 1000 for r in rounds]
        line = f"{side:8} {statistics.median(rps):7.0f} req/s [{min(rps):.0f}, {max(rps):.0f}]"
        line += f"  p50 {statistics.median(p50):.2f} ms [{min(p50):.2f}, {max(p50):.2f}]"
        if side != "off":
            ratio = statistics.median(r[side]["rps"] / r["off"]["rps"] for r in rounds)
            added = statistics.median(
                (r[side]["lat_p50_us"] - r["off"]["lat_p50_us"]) / 1000 for r in rounds
            )
            line += f"  throughput x{ratio:.3f} of off, p50 {added:+.2f} ms"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

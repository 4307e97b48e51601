"""`python -m bench.chaos --minutes N`: the chaos soak (bench/chaos/__init__.py); prints
its figures as a table and exits 1 when an invariant did not hold."""

from __future__ import annotations

import argparse
import json
import sys

from adapters.llama_server.kind import default_binary
from bench.chaos.fleet import RealLlama
from bench.chaos.soak import Soak, check, run, table
from tests.support.real_engines import SMOLLM2_GGUF


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--period-s", type=float, default=30.0, help="between kills")
    parser.add_argument("--no-real", action="store_true", help="no real llama-server")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument(
        "--redis",
        choices=("sentinel", "cluster"),
        default="sentinel",
        help="a primary, a replica and three sentinels; or a three-node cluster",
    )
    args = parser.parse_args()
    real = None if args.no_real else RealLlama(default_binary(), SMOLLM2_GGUF)
    figures = check(run(Soak(args.minutes, period_s=args.period_s, redis=args.redis), real))
    print("| figure | value |\n|---|---|\n" + table(figures))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=1, default=str)
    return 0 if figures["held"] else 1


if __name__ == "__main__":
    sys.exit(main())

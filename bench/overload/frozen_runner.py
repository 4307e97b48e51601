"""Experiment: `python -m runner`, with its import-time objects frozen out of the collector.

    python -m bench.overload.frozen_runner     # same environment variables as python -m runner

Importing the runner (FastAPI, pydantic, prometheus_client, uvicorn, cryptography, ...)
leaves ~78,000 objects tracked by Python's garbage collector; a full (generation 2)
collection walks all of them, about 25-65 ms on this machine, during which the event loop
answers nobody. Under the overload bench's load such a collection runs every ~10 s, so it
sets the p99.9 and the maximum of refusal latency. This launcher imports what
`quorum serve` imports, collects once and calls `gc.freeze()` (Python 3.7+) before serving,
so those objects are never walked again. The bench's `--frozen-gc` runs the runners this way
to measure what the same two lines would change inside the runner itself.
"""

from __future__ import annotations

import gc
import sys

import runner.app
import runner.server
import tenants.config
from runner.cli import main

if __name__ == "__main__":
    assert runner.app and runner.server and tenants.config  # imported for their objects
    gc.collect()
    gc.freeze()
    sys.exit(main(["serve"]))

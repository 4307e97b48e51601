"""Many engine swaps under concurrent traffic on a busy machine, on the stand-in
llama-server: no request answered anything but 200 (the same on the real llama-server:
tests/runner/lifecycle/test_adapter_ops_llama_real.py). The deterministic reproduction of
the race these guard against: tests/runner/engines/test_pool_swap.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.runner_proc import RunnerProcess, fixture_bin, start_runner
from tests.support.swaps import Traffic, busy_cpu, swap_adapter
from tests.support.tokens import DEV_AUDIT_KEY, DEV_REGISTRY

pytestmark = pytest.mark.timeout(300)

SWAPS = 20  # engine starts: a load and an unload each start it again


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[RunnerProcess]:
    """`base` on the stand-in, two slots, with a declared adapter `base:own` (team-a)."""
    own = tmp_path / "own.gguf"
    own.write_bytes(b"GGUF adapter stand-in: own")
    models = f"""models:
  - id: base
    backend: llama-server
    path: {tmp_path}/base.gguf
    parallel: 2
    preload: true
    adapters:
      - {{name: own, path: {own}, tenants: [team-a]}}
"""
    env = {
        "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
        "GOVERNANCE_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
        "GOVERNANCE_AUDIT_KEY": str(DEV_AUDIT_KEY),
        "LLAMA_SERVER_BIN": fixture_bin("llama-server-slow-slots"),  # erases take 50 ms
        "LLAMA_SLOT_CACHE_ENTRIES": "0",  # the stand-in keeps no slot states to save
        "QUEUE_TIMEOUT_MS": "120000",  # a busy machine's swaps are slow, never a refusal
    }
    with start_runner(models_file=models, env=env, ready_timeout=60) as runner:
        yield runner


def test_engine_swap_stress_twenty_swaps_under_six_clients_on_a_busy_machine(
    runner: RunnerProcess, tmp_path: Path
) -> None:
    """20 engine swaps (10 governed adapter loads and 10 unloads) while 6 clients of 3
    tenants (the base and an adapter, streamed and not) send requests, two CPU spinners
    beside them: every request is answered 200, and every swap happened."""
    extra = tmp_path / "extra.gguf"
    extra.write_bytes(b"GGUF adapter stand-in: extra")
    clients = [("base", "team-b"), ("base", "team-c"), ("base:own", "team-a")] * 2
    started = time.monotonic()
    with busy_cpu(2), Traffic(runner.url, clients) as traffic:
        for _ in range(SWAPS // 2):
            swap_adapter(runner.url, "base", "base:extra", extra, ["team-c"])
    seconds = time.monotonic() - started
    failed = traffic.sent - traffic.outcomes["ok"]
    print(f"swaps={SWAPS} requests={traffic.sent} non2xx={failed} seconds={seconds:.0f}")
    assert traffic.failures == [], traffic.failures[:5]
    assert runner.log().count("engine started again") == SWAPS
    assert traffic.outcomes["ok"] >= 2 * len(clients)

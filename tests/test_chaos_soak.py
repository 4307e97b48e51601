"""The chaos soak's short form (bench/chaos): three runners on a Redis primary, a replica
and three sentinels, stand-in engines, the real llama-server and a fake ComfyUI per runner,
under load from three tenants with token budgets, cache-flush tokens each sent twice at once
to their runner and again later, and async image jobs, while the Redis primary, a runner
and an engine are SIGKILLed once each."""

from __future__ import annotations

import pytest

from bench.chaos.fleet import RealLlama
from bench.chaos.soak import Soak, check, run
from tests.support.real_engines import LlamaServer

pytestmark = pytest.mark.timeout(600)


def test_chaos_soak_invariants_hold_through_one_kill_of_each_kind(
    real_llama_server: LlamaServer,
) -> None:
    """One kill of each kind: no token performed twice, every answer within the failure
    contract (429/503 with Retry-After, no 500, no reset but from a killed runner), each
    tenant's output within its budget plus the failover bound, a 200 through every runner
    concerned after each kill, and no async job lost or run twice."""
    real = RealLlama(real_llama_server.bin, real_llama_server.smollm2)
    figures = check(run(Soak(minutes=0, period_s=10, warmup_s=8), real))
    assert figures["kills"] == {"redis-primary": 1, "runner": 1, "engine": 1}, figures
    assert figures["tokens_performed_twice"] == [], figures
    assert figures["tokens_performed_once"], figures  # the fleet did perform tokens
    assert figures["off_contract"] == [], figures
    assert figures["budget_over_bound"] == {}, figures
    assert figures["not_recovered"] == [], figures
    assert figures["jobs_accepted"], figures  # the fleet did take jobs
    assert figures["jobs_lost"] == [], figures
    assert figures["jobs_run_twice"] == [], figures
    assert figures["jobs_succeeded_without_a_run"] == [], figures
    by_kind = figures["by_kind"]
    assert isinstance(by_kind, dict) and by_kind.get("real"), figures  # the real model asked

"""Charged what the engine did, on the real vLLM (PyPI's CPU build, Gemma 3 270M,
scripts/install-vllm): the Hypothesis-drawn mixed run of
tests/runner/tenancy/test_guard_charge_real.py (whole answers, streams with and without
usage, streams the client leaves, two tenants, chat and completions, varied `max_tokens`
and stop sequences) is charged, in `GET /v1/usage`, never less than the engine's
`vllm:generation_tokens_total` delta; fuzzed bodies are refused 400 or served within their
reservation and charged what vLLM counted."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.tenancy.guard import CUT_ALLOWANCE_TOKENS
from tests.support.charge_run import Req, Tally, batches, run_batch
from tests.support.engine_counters import EngineCounters, vllm_counters
from tests.support.fuzz_bodies import Target, bodies, check_body
from tests.support.poll import eventually
from tests.support.real_vllm import DEFAULT_ID, START_TIMEOUT_S, default_entry, models_file
from tests.support.runner_proc import RunnerProcess, start_runner
from tests.support.tokens import FAIRNESS, gateway_env

pytestmark = pytest.mark.timeout(1500)

READY_S = 3 * START_TIMEOUT_S  # the runner is ready once vLLM is: minutes on a busy CPU

TENANTS = """
tenants:
  alpha:
    token_budgets: [{tokens: 2000000, per: hour}]
  beta:
    token_budgets: [{tokens: 2000000, per: day, count: output}]
  gamma:
    token_budgets: [{tokens: 2000000, per: hour, count: output}]
"""


@dataclass
class Served:
    runner: RunnerProcess
    engine: EngineCounters


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, real_vllm: None) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("charge-vllm")
    (folder / "tenants.yaml").write_text(TENANTS)
    env = {
        "TENANTS_FILE": str(folder / "tenants.yaml"),
        **gateway_env("alpha"),
        "USAGE_DB": str(folder / "usage.sqlite3"),
        "QUEUE_TIMEOUT_MS": "300000",
        "RUNNER_MEMORY_MB": "16384",
    }
    models = models_file(default_entry(preload=True, parallel=2, load_timeout_s=READY_S))
    with start_runner(models_file=models, env=env, ready_timeout=READY_S) as r:
        eventually(lambda: _vllm_up(r), timeout=READY_S)
        engine = vllm_counters(r.proc.pid)
        yield Served(r, engine)
        engine.close()


def _vllm_up(r: RunnerProcess) -> bool:
    try:
        engine = vllm_counters(r.proc.pid)
    except AssertionError:  # not started yet
        return False
    try:
        return engine.idle()
    except httpx.TransportError:  # its socket not listening yet
        return False
    finally:
        engine.close()


def test_charge_vllm_mixed_run_is_charged_what_the_engine_generated(served: Served) -> None:
    """Charged completion tokens never fall below vLLM's counter delta (each batch and in
    all) and exceed it by at most 2% plus the cut allowance of each stream left early."""
    tally = Tally()

    @settings(max_examples=5, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(batch=batches)
    def one_batch(batch: list[Req]) -> None:
        generated, spent = run_batch(served.runner.url, DEFAULT_ID, served.engine, batch, tally)
        assert spent >= generated, (batch, generated, spent)

    one_batch()
    print(f"vLLM charge run: {tally}")
    assert tally.generated > 0
    assert tally.within(0.02, CUT_ALLOWANCE_TOKENS), tally


def test_charge_vllm_fuzzed_bodies_are_refused_or_charged_what_ran(served: Served) -> None:
    """Bodies drawn from OpenAI's fields and vLLM's own: each is a 400 naming why, or a
    200 that generated no more than it reserved and was charged what vLLM counted."""
    engine = served.engine

    def generated() -> int:
        eventually(engine.idle, timeout=120)
        return engine.generated()

    target = Target(served.runner.url, "vllm", DEFAULT_ID, generated)

    @settings(max_examples=6, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(drawn=st.data())
    def one(drawn: st.DataObject) -> None:
        chat, body = drawn.draw(bodies("vllm", DEFAULT_ID))
        check_body(target, {FAIRNESS: "gamma"}, 2_000_000, chat, body)

    one()

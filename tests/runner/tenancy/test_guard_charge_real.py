"""Charged what the engine did, on the real llama-server (Gemma 3 270M GGUF,
scripts/install): a Hypothesis-drawn mixed run (whole answers, streams with and without
usage, streams the client leaves, two tenants, chat and completions, varied `max_tokens`
and stop sequences) through one runner is charged, in `GET /v1/usage`, never less than
the engine's own `llamacpp:tokens_predicted_total` delta and within 2% of it; while such a
run is under way, `/slots` never shows more busy slots than the scheduler granted; fuzzed
bodies (tests/support/fuzz_bodies.py) are refused 400 or served within their reservation
and charged what the engine counted."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.tenancy.guard import CUT_ALLOWANCE_TOKENS
from tests.runner.engines.test_llama_real import MODEL, _models
from tests.support.charge_run import Req, Tally, batches, run_batch, send
from tests.support.engine_counters import EngineCounters, llama_counters
from tests.support.fuzz_bodies import Target, bodies, check_body
from tests.support.poll import eventually
from tests.support.real_engines import LlamaServer
from tests.support.runner_proc import RunnerProcess, start_runner
from tests.support.tokens import FAIRNESS, gateway_env

pytestmark = pytest.mark.timeout(600)

PARALLEL = 2
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
def served(
    tmp_path_factory: pytest.TempPathFactory, real_llama_server: LlamaServer
) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("charge")
    (folder / "tenants.yaml").write_text(TENANTS)
    env = {
        "TENANTS_FILE": str(folder / "tenants.yaml"),
        **gateway_env("alpha"),
        "USAGE_DB": str(folder / "usage.sqlite3"),
        "QUEUE_TIMEOUT_MS": "300000",  # a busy two-core machine: never a queue timeout
    }
    models = _models(real_llama_server.gemma, parallel=PARALLEL)
    with start_runner(models_file=models, env=env, ready_timeout=120) as r:
        engine = llama_counters(r.proc.pid, MODEL)
        yield Served(r, engine)
        engine.close()


def test_charge_real_llama_mixed_run_is_charged_what_the_engine_generated(
    served: Served,
) -> None:
    """Charged completion tokens never fall below the engine's counter delta (each batch
    and in all) and exceed it by at most 2% plus the cut allowance of each stream left
    early."""
    tally = Tally()

    @settings(max_examples=12, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(batch=batches)
    def one_batch(batch: list[Req]) -> None:
        generated, spent = run_batch(served.runner.url, MODEL, served.engine, batch, tally)
        assert spent >= generated, (batch, generated, spent)

    one_batch()
    print(f"llama-server charge run: {tally}")
    assert tally.generated > 0
    assert tally.within(0.02, CUT_ALLOWANCE_TOKENS), tally


def _granted(url: str) -> int:
    text = httpx.get(url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("quorum_requests_in_flight{") and f'model="{MODEL}"' in line:
            return round(float(line.rsplit(" ", 1)[1]))
    return 0


def test_charge_real_llama_busy_slots_never_exceed_the_grants(served: Served) -> None:
    """Four concurrent streams on two slots: every `/slots` read between two reads of the
    scheduler's grants (`quorum_requests_in_flight`) finds no more busy slots than the
    larger of the two, never more than `parallel`, and both slots busy at some point."""
    url, engine = served.runner.url, served.engine
    prompt = "Count to fifty."
    reqs = [Req("alpha" if i % 2 else "beta", True, "stream", 16, prompt) for i in range(4)]
    done = threading.Event()
    seen: list[tuple[int, int, int]] = []

    def watch() -> None:
        while not done.is_set():
            before = _granted(url)
            busy = sum(bool(s.get("is_processing")) for s in engine.slots())
            seen.append((before, busy, _granted(url)))

    with ThreadPoolExecutor(5) as pool:
        watcher = pool.submit(watch)
        statuses = list(pool.map(lambda r: send(url, MODEL, r), reqs))
        done.set()
        watcher.result(timeout=60)
    assert all(s == "200" for s in statuses), statuses
    assert all(busy <= max(a, b) <= PARALLEL for a, busy, b in seen), seen
    assert max(busy for _, busy, _ in seen) == PARALLEL, seen


def test_charge_real_llama_fuzzed_bodies_are_refused_or_charged_what_ran(
    served: Served,
) -> None:
    """Bodies drawn from OpenAI's fields and llama-server's own: each is a 400 naming why,
    or a 200 that generated no more than it reserved and was charged what the engine
    counted (within 2%)."""
    engine = served.engine

    def generated() -> int:
        eventually(engine.idle, timeout=120)
        return engine.generated()

    target = Target(served.runner.url, "llama-server", MODEL, generated)

    @settings(max_examples=20, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(drawn=st.data())
    def one(drawn: st.DataObject) -> None:
        chat, body = drawn.draw(bodies("llama-server", MODEL))
        check_body(target, {FAIRNESS: "gamma"}, 2_000_000, chat, body)

    one()

"""Fuzzed bodies (tests/support/fuzz_bodies.py) through a real runner in front of the fake
llama-server and the fake vLLM (attached by URL; each fake counts every sequence it would
run in `tokens_predicted_total`): a body is refused 400 or served 200, and a served one
made the engine generate no more than it reserved and exactly what it was charged. The
quick tier's short run; test_guard_charge_real.py and test_guard_charge_vllm_real.py run it on
the real engines."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.fake_vllm import BIN
from tests.fixtures.launch import start_fake
from tests.support.fuzz_bodies import Target, bodies, check_body
from tests.support.groups import end_group
from tests.support.poll import eventually
from tests.support.ports import free_port
from tests.support.runner_proc import start_runner

pytestmark = pytest.mark.timeout(240)

BUDGET = 10_000_000  # output tokens per hour: never the reason for a refusal
KEY = "fuzz-key-0123456789abcdef0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _tenants(folder: Path) -> dict[str, str]:
    digest = "sha256:" + hashlib.sha256(KEY.encode()).hexdigest()
    (folder / "tenants.yaml").write_text(
        f"tenants:\n  fuzz:\n    api_keys: ['{digest}']\n"
        f"    token_budgets: [{{tokens: {BUDGET}, per: hour, count: output}}]\n"
    )
    return {"TENANTS_FILE": str(folder / "tenants.yaml")}


def _fake_count(url: str) -> int:
    return int(httpx.get(url + "/_fake/stats", timeout=10).json()["tokens_predicted_total"])


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module", params=["llama-server", "vllm"])
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    env = _tenants(tmp_path_factory.mktemp("fuzz"))
    if request.param == "llama-server":
        with start_fake("fake_openai", "--latency-ms", "0", "--chunks", "4") as engine:
            models = f"models:\n  - {{id: m, backend: llama-server, url: '{engine.url}'}}\n"
            with start_runner(models_file=models, env=env) as runner:
                yield Target(runner.url, "llama-server", "m", lambda: _fake_count(engine.url))
        return
    port = free_port()
    argv = [str(BIN), "serve", "org/a", "--port", str(port), "--served-model-name", "a"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        eventually(lambda: _healthy(url), timeout=30)
        models = f"models:\n  - {{id: a, backend: vllm, url: '{url}'}}\n"
        with start_runner(models_file=models, env=env) as runner:
            yield Target(runner.url, "vllm", "a", lambda: _fake_count(url))
    finally:
        end_group(proc)


def test_charge_fuzz_fakes_any_body_is_refused_or_charged_what_ran(target: Target) -> None:
    """A short fuzz on each fake: every body is a 400 naming why, or a 200 that generated
    within its reservation and was charged exactly what the engine counted."""

    @settings(max_examples=25, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(drawn=st.data())
    def one(drawn: st.DataObject) -> None:
        chat, body = drawn.draw(bodies(target.kind, target.model))
        check_body(target, AUTH, BUDGET, chat, body)

    one()

"""LoRA adapters through the runner on the real vLLM (PyPI's CPU build, scripts/install-vllm)
with the PEFT adapters scripts/make-adapters trained: vLLM 0.32.0's CPU build serves LoRA
(`PunicaWrapperCPU`), from start (`--lora-modules`) and loaded at runtime
(`/v1/load_lora_adapter`).

One runner (module scope): the default `gemma-3-270m-vllm` with adapters `alpha` (team-a)
and `bravo` (team-b) and room for one more.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.adapters import adapters, answer, chat, governed, said
from tests.support.real_vllm import (
    DEFAULT_ID,
    START_TIMEOUT_S,
    default_entry,
    models_file,
)
from tests.support.runner_proc import RunnerProcess, start_runner
from tests.support.tokens import DEV_REGISTRY

pytestmark = pytest.mark.timeout(600)

ALPHA, BRAVO, CHARLIE = (f"{DEFAULT_ID}:{n}" for n in ("alpha", "bravo", "charlie"))


@pytest.fixture(scope="module")
def runner(real_vllm: None) -> Iterator[RunnerProcess]:
    a = adapters()
    entry = default_entry(
        preload=True,
        parallel=4,
        max_adapters=3,
        adapters=[
            {"name": "alpha", "path": str(a["alpha"].peft), "tenants": ["team-a"]},
            {"name": "bravo", "path": str(a["bravo"].peft), "tenants": ["team-b"]},
        ],
    )
    env = {
        "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
        "QUEUE_TIMEOUT_MS": "240000",
        "MAX_QUEUE_DEPTH": "64",
        "RUNNER_MEMORY_MB": "16384",
    }
    with start_runner(models_file=models_file(entry), env=env, ready_timeout=START_TIMEOUT_S) as r:
        yield r


def test_vllm_adapters_answer_with_their_canaries_concurrently(runner: RunnerProcess) -> None:
    """On vLLM too each adapter says its own canary and the base model none, with the three
    kinds of request in flight together in vLLM's batches; a tenant not bound to an
    adapter gets 404, as for an adapter that does not exist."""
    a = adapters()
    plan = [
        (ALPHA, "team-a", {a["alpha"].canary}),
        (BRAVO, "team-b", {a["bravo"].canary}),
        (DEFAULT_ID, "team-c", set()),
    ] * 4

    def one(i: int) -> tuple[set[str], set[str]]:
        model, tenant, want = plan[i]
        return said(answer(chat(runner.url, model, tenant, f"Question {i}: where?"))), want

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(len(plan))))
    assert all(got == want for got, want in results), results
    r = chat(runner.url, ALPHA, "team-b")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_vllm_governed_adapter_load_in_place(runner: RunnerProcess) -> None:
    """A governed adapter-load on vLLM loads the PEFT folder into the running engine (its
    sha256: the folder's digest) while requests run, and it answers with its canary; the
    picker's LoRA family and capabilities list it; a fourth one finds no room (409)."""
    a = adapters()
    body = {
        "adapterId": CHARLIE,
        "baseModel": DEFAULT_ID,
        "path": str(a["charlie"].peft),
        "sha256": a["charlie"].peft_sha256,
        "tenants": ["team-c"],
    }
    with ThreadPoolExecutor(2) as pool:
        busy = [pool.submit(chat, runner.url, ALPHA, "team-a", f"Q{i}?") for i in range(4)]
        r = governed(runner.url, "/v1/adapters/load", "adapter-load", body)
        assert r.status_code == 200, r.text
        assert [f.result().status_code for f in busy] == [200] * 4
    assert r.json()["state"] == "loaded" and r.json()["rank"] == a["charlie"].rank
    assert said(answer(chat(runner.url, CHARLIE, "team-c"))) == {a["charlie"].canary}
    seen: dict[str, str] = {}
    for tenant in ("team-a", "team-b", "team-c"):  # each sees its own adapters only
        headers = {"X-Tenant-ID": tenant}
        caps = httpx.get(runner.url + "/v1/capabilities", headers=headers).json()
        seen |= {e["id"]: e["state"] for e in caps["adapters"]}
    assert seen == {
        ALPHA: "loaded",
        BRAVO: "loaded",
        CHARLIE: "loaded",
    }
    text = httpx.get(runner.url + "/metrics/picker").text
    (lora,) = next(
        f.samples
        for f in text_string_to_metric_families(text)
        if f.name == "vllm:lora_requests_info"
    )
    assert lora.labels["running_lora_adapters"] == ",".join(sorted((ALPHA, BRAVO, CHARLIE)))
    delta = {
        **body,
        "adapterId": f"{DEFAULT_ID}:delta",
        "path": str(a["delta"].peft),
        "sha256": a["delta"].peft_sha256,
    }
    r = governed(runner.url, "/v1/adapters/load", "adapter-load", delta)
    assert r.status_code == 409 and r.json()["error"]["code"] == "adapter_refused"
    unload = {"adapterId": CHARLIE, "baseModel": DEFAULT_ID, "sha256": body["sha256"]}
    r = governed(runner.url, "/v1/adapters/unload", "adapter-unload", unload)
    assert r.status_code == 200, r.text
    assert chat(runner.url, CHARLIE, "team-c").status_code == 404

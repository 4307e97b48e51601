"""LoRA adapters through the runner on the real llama-server: the real Gemma 3 270M GGUF
and the adapters scripts/make-adapters trained, each answering with its own canary word.

One runner (module scope): `gemma` (two slots) with adapters `alpha` (tenant team-a) and
`bravo` (team-b and team-b-*), and a second model `other` that must never be touched by an
adapter load. Governance on (the dev registry), audit to a file.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.adapters import adapters, answer, chat, governed, said
from tests.support.real_engines import LlamaServer
from tests.support.runner_proc import RunnerProcess, start_runner
from tests.support.swaps import Traffic, busy_cpu, swap_adapter
from tests.support.tokens import DEV_AUDIT_KEY, DEV_REGISTRY, dev_token

pytestmark = pytest.mark.timeout(300)

ALPHA, BRAVO = "gemma:alpha", "gemma:bravo"
SWAPS = 20  # engine starts: a load and an unload each start it again


def _models(gguf: Path) -> str:
    a = adapters()
    return f"""
models:
  - id: gemma
    backend: llama-server
    path: {gguf}
    context_length: 512
    parallel: 2
    preload: true
    adapters:
      - {{name: alpha, path: {a["alpha"].gguf}, sha256: {a["alpha"].gguf_sha256},
          tenants: [team-a]}}
      - {{name: bravo, path: {a["bravo"].gguf}, tenants: [team-b, "team-b-*"]}}
  - id: other
    backend: llama-server
    path: {gguf}
    context_length: 256
    parallel: 1
    preload: true
"""


QUEUE_TIMEOUT_S = 240
"""How long the runner keeps a request queued here: a busy 2-core machine's swaps are slow
(the first took 54 s in CI run 16), and none may be refused."""


@pytest.fixture(scope="module")
def runner(
    real_llama_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunnerProcess]:
    audit = tmp_path_factory.mktemp("audit") / "audit.jsonl"
    env = {
        "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
        "GOVERNANCE_AUDIT_LOG": str(audit),
        "GOVERNANCE_AUDIT_KEY": str(DEV_AUDIT_KEY),
        "UNLOAD_DRAIN_TIMEOUT_S": "120",
        "QUEUE_TIMEOUT_MS": str(QUEUE_TIMEOUT_S * 1000),  # a busy 2-core machine: no refusal
        "MAX_QUEUE_DEPTH": "64",
    }
    models = _models(real_llama_server.gemma)
    with start_runner(models_file=models, env=env, ready_timeout=180) as r:
        r.audit = audit  # type: ignore[attr-defined]
        yield r


def test_adapter_answers_with_its_canary_and_the_base_with_none(runner: RunnerProcess) -> None:
    """Each adapter makes the base model say its own canary; the base model says none."""
    a = adapters()
    assert said(answer(chat(runner.url, ALPHA, "team-a"))) == {a["alpha"].canary}
    assert said(answer(chat(runner.url, BRAVO, "team-b-eu"))) == {a["bravo"].canary}
    assert said(answer(chat(runner.url, "gemma", "team-a"))) == set()


def test_adapter_of_another_tenant_is_404_as_an_unknown_one(runner: RunnerProcess) -> None:
    """Naming an adapter the tenant is not bound to answers as an id no adapter has (404
    model_not_found): nobody learns of adapters bound to others."""
    r = chat(runner.url, ALPHA, "team-b")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert r.json()["error"]["model"] == ALPHA
    r = chat(runner.url, "gemma:nobody", "team-a")
    assert r.status_code == 404


def test_client_lora_field_never_selects_an_adapter(runner: RunnerProcess) -> None:
    """A client's own `lora` list (llama-server's per-request adapter choice) is removed:
    on the base model it selects nothing, on another adapter it changes nothing."""
    grab = [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 1.0}]
    assert said(answer(chat(runner.url, "gemma", "team-c", lora=grab))) == set()
    bravo = adapters()["bravo"].canary
    assert said(answer(chat(runner.url, BRAVO, "team-b", lora=grab))) == {bravo}


def test_concurrent_mixed_traffic_never_crosses_adapters(runner: RunnerProcess) -> None:
    """Tenants A (alpha), B (bravo) and C (base) at the same time on one engine, both slots
    busy, requests of different adapters interleaved in the engine's batches (the vllm#47724
    scenario): every answer carries exactly its own adapter's canary, B never A's."""
    a = adapters()
    plan = [
        (ALPHA, "team-a", {a["alpha"].canary}),
        (BRAVO, "team-b", {a["bravo"].canary}),
        ("gemma", "team-c", set()),
    ] * 6

    def one(i: int) -> tuple[set[str], set[str]]:
        model, tenant, want = plan[i]
        return said(answer(chat(runner.url, model, tenant, f"Question {i}: where?"))), want

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(len(plan))))
    assert all(got == want for got, want in results), results


def test_capabilities_and_picker_list_real_adapters(runner: RunnerProcess) -> None:
    """Capabilities list each adapter with its base, rank (read from the GGUF), memory and
    state, and a loaded one among the loaded models; the picker's
    `vllm:lora_requests_info` names the loaded adapters, not the models. Each tenant sees
    the adapters bound to it only."""
    caps = httpx.get(runner.url + "/v1/capabilities", headers={"X-Tenant-ID": "team-a"}).json()
    entries = {e["id"]: e for e in caps["adapters"]}
    assert entries[ALPHA]["baseModel"] == "gemma" and entries[ALPHA]["state"] == "loaded"
    assert entries[ALPHA]["rank"] == adapters()["alpha"].rank
    assert entries[ALPHA]["memoryMB"] > 0
    assert entries[ALPHA]["requests"] == {"running": 0, "waiting": 0}
    assert BRAVO not in entries  # bound to team-b
    caps = httpx.get(runner.url + "/v1/capabilities", headers={"X-Tenant-ID": "team-b"}).json()
    loaded = {m["id"]: m for m in caps["models"]["loaded"]}
    assert loaded[BRAVO]["baseModel"] == "gemma"
    text = httpx.get(runner.url + "/metrics/picker").text
    (lora,) = next(
        f.samples
        for f in text_string_to_metric_families(text)
        if f.name == "vllm:lora_requests_info"
    )
    assert lora.labels["running_lora_adapters"] == f"{ALPHA},{BRAVO}"
    assert lora.labels["max_lora"] == "2"
    listed = httpx.get(runner.url + "/v1/models", headers={"X-Tenant-ID": "team-a"}).json()
    ids = {m["id"] for m in listed["data"]}
    assert ALPHA in ids and BRAVO not in ids  # a tenant sees the adapters it may use


def test_governed_adapter_load_and_unload_under_traffic(runner: RunnerProcess) -> None:
    """A governed adapter-load (2 of 3, bound to the adapter's id, base and sha256; audited)
    under traffic on the base and another adapter: no request fails, the other model is
    not touched, the new adapter answers with its canary for its tenant only. A load
    naming another file's digest is approved, then refused (400: what the file is, is told
    only to a caller with a token); a token for other tenants is refused. Unloaded under
    traffic again: nothing fails, and it is gone."""
    a = adapters()
    body = {
        "adapterId": "gemma:charlie",
        "baseModel": "gemma",
        "path": str(a["charlie"].gguf),
        "sha256": a["charlie"].gguf_sha256,
        "tenants": ["team-c"],
    }
    other_before = _loaded_at(runner, "other")
    wrong = {**body, "sha256": a["delta"].gguf_sha256}  # another file's digest
    r = governed(runner.url, "/v1/adapters/load", "adapter-load", wrong)
    assert r.status_code == 400 and "sha256" in r.json()["error"]["message"]
    token = dev_token("adapter-load", "gemma:charlie", {**body, "tenants": ["team-x"]})
    forged = {**body, "verifiedOpToken": token}  # signed for other tenants
    r = httpx.post(runner.url + "/v1/adapters/load", json=forged, timeout=60)
    assert r.status_code == 403
    with _traffic(runner) as statuses:
        r = governed(runner.url, "/v1/adapters/load", "adapter-load", body)
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "loaded" and r.json()["rank"] == a["charlie"].rank
    assert statuses and set(statuses) == {200}
    assert said(answer(chat(runner.url, "gemma:charlie", "team-c"))) == {a["charlie"].canary}
    assert (
        chat(runner.url, "gemma:charlie", "team-a").status_code == 404
    )  # bound to others: unknown to it
    assert said(answer(chat(runner.url, ALPHA, "team-a"))) == {a["alpha"].canary}
    assert _loaded_at(runner, "other") == other_before  # nothing else swapped
    records = [json.loads(line) for line in Path(runner.audit).read_text().splitlines()]  # type: ignore[attr-defined]
    loads = [r for r in records if r["operation"] == "adapter-load"]
    # the wrong file is approved, then refused (400); the forged token rejected
    assert [r["outcome"] for r in loads] == ["approved", "rejected", "approved"]
    assert loads[-1]["model_id"] == "gemma:charlie"
    assert loads[-1]["params"]["sha256"] == a["charlie"].gguf_sha256
    unload = {"adapterId": "gemma:charlie", "baseModel": "gemma", "sha256": body["sha256"]}
    with _traffic(runner) as statuses:
        r = governed(runner.url, "/v1/adapters/unload", "adapter-unload", unload)
        assert r.status_code == 200, r.text
    assert statuses and set(statuses) == {200}
    assert chat(runner.url, "gemma:charlie", "team-c").status_code == 404
    assert said(answer(chat(runner.url, BRAVO, "team-b"))) == {a["bravo"].canary}
    assert _loaded_at(runner, "other") == other_before


def _loaded_at(runner: RunnerProcess, model: str) -> int:
    caps = httpx.get(runner.url + "/v1/capabilities").json()
    return int(next(m["loadedAt"] for m in caps["models"]["loaded"] if m["id"] == model))


class _traffic:
    """Requests on the base model and on `alpha` from two threads until the block ends;
    their statuses collected (every request answered is counted)."""

    def __init__(self, runner: RunnerProcess) -> None:
        self.runner = runner
        self.statuses: list[int] = []
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._send, args=(m, t), daemon=True)
            for m, t in (("gemma", "team-c"), (ALPHA, "team-a"))
        ]

    def _send(self, model: str, tenant: str) -> None:
        i = 0
        while not self.stop.is_set() or i < 2:
            r = chat(self.runner.url, model, tenant, f"Request {i}, where is it?")
            self.statuses.append(r.status_code)
            i += 1

    def __enter__(self) -> list[int]:
        for t in self.threads:
            t.start()
        return self.statuses

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)


@pytest.mark.timeout(900)
def test_engine_swap_stress_twenty_real_restarts_under_six_clients_on_a_busy_machine(
    runner: RunnerProcess,
) -> None:
    """20 restarts of the real llama-server (10 governed loads and 10 unloads of
    `charlie`) while 6 clients (the base, alpha and bravo, streamed and not) send requests
    and two CPU spinners run beside them: every request is answered 200, with its slots
    saved and restored across the engines (the stand-in's run: test_pool_swap_stress.py)."""
    charlie = adapters()["charlie"]
    clients = [("gemma", "team-c"), (ALPHA, "team-a"), (BRAVO, "team-b")] * 2
    before = runner.log().count("engine started again")
    started = time.monotonic()
    client_timeout = QUEUE_TIMEOUT_S + 60  # a request the runner still queues is not lost
    with busy_cpu(2), Traffic(runner.url, clients, 4, timeout_s=client_timeout) as traffic:
        for _ in range(SWAPS // 2):
            swap_adapter(runner.url, "gemma", "gemma:charlie", charlie.gguf, ["team-c"])
    failed = traffic.sent - traffic.outcomes["ok"]
    seconds = time.monotonic() - started
    print(f"swaps={SWAPS} requests={traffic.sent} non2xx={failed} seconds={seconds:.0f}")
    assert traffic.failures == [], traffic.failures[:5]
    assert runner.log().count("engine started again") - before == SWAPS

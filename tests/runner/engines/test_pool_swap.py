"""An engine swapped under a request (`ModelPool.restart_engine`: a LoRA adapter change
on llama-server starts the engine again beside the running one): the request is served
by the old engine, or retried once on the new one, never answered a 5xx.

The window is made wide on purpose: the stand-in llama-server holds a slot erase (which
`LlamaServerEngine.place` sends before the request itself) until the test opens a gate,
and a SIGTERM while it holds one ends it at once. Before adapters/in_flight.py a request
still preparing its slot did not count as in flight, so the swap stopped the old engine
under it: 502 (the CI failure of test_governed_adapter_load_and_unload_under_traffic).
The stress test under traffic: tests/runner/engines/test_pool_swap_stress.py.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.adapters import governed
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, fixture_bin, start_runner
from tests.support.tokens import DEV_AUDIT_KEY, DEV_REGISTRY

pytestmark = pytest.mark.timeout(90)


class Swap:
    """A runner serving `base` on the gated stand-in, one slot, no saved slot states;
    requests sent in the background keep their thread and answer by name."""

    def __init__(self, runner: RunnerProcess, gate: Path, adapter: Path) -> None:
        self.runner, self.gate, self.adapter = runner, gate, adapter
        self.threads: dict[str, threading.Thread] = {}
        self.answers: dict[str, httpx.Response] = {}

    def chat(self, tenant: str) -> httpx.Response:
        body = {"model": "base", "messages": [{"role": "user", "content": f"hi from {tenant}"}]}
        url = self.runner.url + "/v1/chat/completions"
        return httpx.post(url, json=body, headers={"X-Tenant-ID": tenant}, timeout=60)

    def load_adapter(self) -> httpx.Response:
        body = {
            "adapterId": "base:new",
            "baseModel": "base",
            "path": str(self.adapter),
            "sha256": hashlib.sha256(self.adapter.read_bytes()).hexdigest(),
            "tenants": ["team-b"],
        }
        return governed(self.runner.url, "/v1/adapters/load", "adapter-load", body)

    def send(self, name: str, call: Callable[[], httpx.Response]) -> None:
        thread = threading.Thread(target=lambda: self.answers.__setitem__(name, call()))
        self.threads[name] = thread
        thread.start()

    def answer(self, name: str) -> httpx.Response:
        self.threads[name].join(60)
        return self.answers[name]

    def swap_under_a_request_preparing_its_slot(self) -> None:
        """Tenant a's prompt fills the one slot; tenant b's request is granted it and
        waits on its erase at the old engine; then an adapter load starts the new engine
        beside the old one and files it."""
        assert self.chat("team-a").status_code == 200
        self.send("b", lambda: self.chat("team-b"))
        eventually(lambda: list(self.gate.glob("waiting-*")), 30, "b's slot erase waiting")
        self.send("load", self.load_adapter)
        eventually(lambda: "engine started again" in self.runner.log(), 60, "the new engine")


@pytest.fixture
def swap(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Swap]:
    """`request.param`: UNLOAD_DRAIN_TIMEOUT_S, the swap's drain bound."""
    gate = tmp_path / "slot-gate"
    gate.mkdir()
    adapter = tmp_path / "new.gguf"
    adapter.write_bytes(b"GGUF adapter stand-in")
    models = f"models:\n  - id: base\n    backend: llama-server\n    path: {tmp_path}/base.gguf\n"
    models += "    parallel: 1\n    preload: true\n"
    env = {
        "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
        "GOVERNANCE_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
        "GOVERNANCE_AUDIT_KEY": str(DEV_AUDIT_KEY),
        "LLAMA_SERVER_BIN": fixture_bin("llama-server-gated-slots"),
        "LLAMA_SLOT_CACHE_ENTRIES": "0",  # a slot another tenant held is erased, not saved
        "UNLOAD_DRAIN_TIMEOUT_S": str(request.param),
    }
    with start_runner(models_file=models, env=env, ready_timeout=60) as runner:
        yield Swap(runner, gate, adapter)
        (gate / "open").touch()  # nothing left waiting on it


@pytest.mark.parametrize("swap", [30], indirect=True)
def test_engine_swap_waits_for_a_request_still_preparing_its_slot(swap: Swap) -> None:
    """A request granted before the swap and still preparing its slot on the old engine
    is served by the old engine: the swap's drain waits for it (200, and the load 200)."""
    swap.swap_under_a_request_preparing_its_slot()
    swap.threads["b"].join(3.0)  # a swap that stops the old engine under b shows it here
    (swap.gate / "open").touch()
    assert swap.answer("b").status_code == 200, swap.answer("b").text
    assert swap.answer("load").status_code == 200, swap.answer("load").text


@pytest.mark.parametrize("swap", [1], indirect=True)
def test_engine_swap_past_the_drain_retries_the_request_on_the_new_engine(swap: Swap) -> None:
    """A request still on the old engine when the swap's drain timeout (1 s) passes, with
    nothing sent to its client yet, is retried once on the new engine: 200, not a 502
    (the gate stays shut: the old engine never answers b's erase); the load answers 200."""
    swap.swap_under_a_request_preparing_its_slot()
    assert swap.answer("load").status_code == 200, swap.answer("load").text
    assert swap.answer("b").status_code == 200, swap.answer("b").text

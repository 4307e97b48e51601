"""Engines swapped under traffic: clients that count every answer, a machine made busy on
purpose, and governed adapter loads and unloads that each start the engine again
(llama-server loads adapters only at start: `ModelPool.restart_engine`).

Used by the swap stress tests on the stand-in (tests/runner/engines/test_pool_swap_stress.py)
and on the real llama-server (tests/runner/lifecycle/test_adapter_ops_llama_real.py); their
figures are in docs/reliability.md ("An engine swapped under traffic").
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.adapters import governed


class Traffic:
    """`clients` threads, each sending chat requests to its (model, tenant) in turn, half
    of them streamed, until the block ends (each sends at least `at_least`). A request
    counts as failed unless it is a 200 whose stream carries no SSE `error` event; one that
    gets no answer within `timeout_s` (keep it above the runner's queue timeout, or a request
    the runner still holds by design reads as lost), or none at all (the connection cut), is
    a failure too, named with how long it waited."""

    def __init__(
        self,
        url: str,
        clients: Sequence[tuple[str, str]],
        max_tokens: int = 8,
        at_least: int = 2,
        timeout_s: float = 120.0,
    ) -> None:
        self.url, self.clients, self.max_tokens, self.at_least = url, clients, max_tokens, at_least
        self.timeout_s = timeout_s
        self.outcomes: Counter[str] = Counter()
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._send, args=(i, model, tenant), daemon=True)
            for i, (model, tenant) in enumerate(clients)
        ]

    def _send(self, client: int, model: str, tenant: str) -> None:
        with httpx.Client(timeout=self.timeout_s) as http:
            i = 0
            while not self._stop.is_set() or i < self.at_least:
                stream = (client + i) % 2 == 1
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": f"Request {i}: where is it?"}],
                    "max_tokens": self.max_tokens,
                    "temperature": 0,
                    "stream": stream,
                }
                headers = {"X-Tenant-ID": tenant}
                sent = time.monotonic()
                try:
                    r = http.post(self.url + "/v1/chat/completions", json=body, headers=headers)
                except httpx.TransportError as exc:  # no answer at all: a request lost
                    waited = time.monotonic() - sent
                    self._count(
                        type(exc).__name__, f"{model} {tenant}: {exc!r} after {waited:.0f} s"
                    )
                else:
                    if r.status_code == 200 and not (stream and "event: error" in r.text):
                        self._count("ok", None)
                    else:
                        why = f"{model} {tenant} {r.status_code}: {r.text[:300]}"
                        self._count(str(r.status_code), why)
                i += 1

    def _count(self, outcome: str, failure: str | None) -> None:
        with self._lock:
            self.outcomes[outcome] += 1
            if failure is not None:
                self.failures.append(failure)

    @property
    def sent(self) -> int:
        return sum(self.outcomes.values())

    def __enter__(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout_s + 60)


@contextmanager
def busy_cpu(processes: int = 2, bound_s: int = 600) -> Iterator[None]:
    """The machine made busy on purpose: `processes` loops spinning on the CPU (each ends
    by itself after `bound_s` if the test that started it does not end it first)."""
    spin = f"import time\nend = time.monotonic() + {bound_s}\nwhile time.monotonic() < end: pass"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(processes)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def swap_adapter(url: str, base: str, adapter_id: str, path: Path, tenants: list[str]) -> None:
    """Load `adapter_id` (governed) and unload it again: two swaps of `base`'s engine."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    unload = {"adapterId": adapter_id, "baseModel": base, "sha256": digest}
    load = {**unload, "path": str(path), "tenants": tenants}
    r = governed(url, "/v1/adapters/load", "adapter-load", load)
    assert r.status_code == 200, r.text
    r = governed(url, "/v1/adapters/unload", "adapter-unload", unload)
    assert r.status_code == 200, r.text

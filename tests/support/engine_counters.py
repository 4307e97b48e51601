"""The real engines' own counters, read from outside the runner that started them: the
reference a test holds the runner's charges against (docs/tenants.md, "How a request is
charged").

- llama-server: `llamacpp:tokens_predicted_total` (every task's decoded tokens, a
  cancelled one's too, added as its slot is released), `llamacpp:requests_processing`
  (tasks on a slot), and `/slots` (each slot's `is_processing`); its URL and API key are
  read from its command line (the key file the runner's user can read).
- vLLM: `vllm:generation_tokens_total` (every step's generated tokens, an aborted
  request's included) and `vllm:num_requests_running` + `vllm:num_requests_waiting`, over
  the Unix socket its command line names (`--uds`, in the runner's scratch folder).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from runner.memory.proc import child_pids

LLAMA_GENERATED = "llamacpp:tokens_predicted_total"
LLAMA_BUSY = "llamacpp:requests_processing"
VLLM_GENERATED = "vllm:generation_tokens_total"
VLLM_BUSY = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in child_pids(todo.pop()) or []:
            found.append(child)
            todo.append(child)
    return found


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@dataclass(frozen=True)
class EngineCounters:
    """One engine's `/metrics` (and llama-server's `/slots`), read the way it serves them."""

    client: httpx.Client
    generated_name: str
    busy_names: tuple[str, ...]

    def metrics(self) -> dict[str, float]:
        text = self.client.get("/metrics", timeout=10).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith(("llamacpp:", "vllm:")):
                name, value = line.rsplit(" ", 1)
                key = name.split("{", 1)[0]
                out[key] = out.get(key, 0.0) + float(value)
        return out

    def generated(self) -> int:
        """Output tokens the engine generated since it started (every request)."""
        return round(self.metrics().get(self.generated_name, 0.0))

    def idle(self) -> bool:
        """No request on the engine (a cut one's tokens are counted once it is off)."""
        figures = self.metrics()
        return all(figures.get(name, 0.0) == 0 for name in self.busy_names)

    def close(self) -> None:
        self.client.close()

    def slots(self) -> list[dict[str, Any]]:
        """llama-server's `/slots` (each slot's state)."""
        answer = self.client.get("/slots", timeout=10)
        answer.raise_for_status()
        slots: list[dict[str, Any]] = answer.json()
        return slots


def llama_counters(runner_pid: int, alias: str) -> EngineCounters:
    """The llama-server serving `alias` under the runner `runner_pid`."""
    for pid in _descendants(runner_pid):
        argv = _argv(pid)
        if "--alias" in argv and _value(argv, "--alias") == alias:
            key = Path(_value(argv, "--api-key-file")).read_text().strip()
            client = httpx.Client(
                base_url=f"http://127.0.0.1:{_value(argv, '--port')}",
                headers={"Authorization": f"Bearer {key}"},
            )
            return EngineCounters(client, LLAMA_GENERATED, (LLAMA_BUSY,))
    raise AssertionError(f"no llama-server {alias!r} under the runner")


def vllm_counters(runner_pid: int) -> EngineCounters:
    """The vLLM the runner `runner_pid` started (its Unix socket)."""
    for pid in _descendants(runner_pid):
        argv = _argv(pid)
        if "--uds" in argv:
            transport = httpx.HTTPTransport(uds=_value(argv, "--uds"))
            client = httpx.Client(transport=transport, base_url="http://vllm")
            return EngineCounters(client, VLLM_GENERATED, VLLM_BUSY)
    raise AssertionError("no vLLM on a Unix socket under the runner")

"""vLLM's own ways to run more than one sequence, through a real runner in front of the
fake vLLM (attached by URL as kind `vllm`; its `tokens_predicted_total` counts every
sequence vLLM would run: `best_of`, else `n`): never more generated than reserved and
charged, one completion per request."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.fake_vllm import BIN
from tests.support.groups import end_group
from tests.support.poll import eventually
from tests.support.ports import free_port
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(90)

BUDGET = 5000  # output tokens per hour
TENANTS = ("bestof", "plain")
WORDS = " ".join(f"w{i}" for i in range(30))


def _key(tenant: str) -> str:
    return f"{tenant}-key-0123456789abcdef0123456789abcdef"


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunnerProcess, str]]:
    folder: Path = tmp_path_factory.mktemp("canonical-vllm")
    lines = ["tenants:"]
    for tenant in TENANTS:
        digest = "sha256:" + hashlib.sha256(_key(tenant).encode()).hexdigest()
        lines += [
            f"  {tenant}:",
            f'    api_keys: ["{digest}"]',
            f"    token_budgets: [{{tokens: {BUDGET}, per: hour, count: output}}]",
        ]
    (folder / "tenants.yaml").write_text("\n".join(lines) + "\n")
    port = free_port()
    argv = [str(BIN), "serve", "org/a", "--port", str(port), "--served-model-name", "a"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        eventually(lambda: _healthy(url), timeout=30)
        models = f"models:\n  - {{id: a, backend: vllm, url: '{url}'}}\n"
        env = {"TENANTS_FILE": str(folder / "tenants.yaml")}
        with start_runner(models_file=models, env=env) as runner:
            yield runner, url
    finally:
        end_group(proc)


def _send(
    served: tuple[RunnerProcess, str], tenant: str, **extra: Any
) -> tuple[httpx.Response, int, int]:
    """The answer, the output tokens the engine generated for it, and the tenant's output
    tokens reserved or spent so far (its budget headers; 0 when refused before any)."""
    runner, engine = served
    before = httpx.get(engine + "/_fake/stats").json()["tokens_predicted_total"]
    body = {"model": "a", "messages": [{"role": "user", "content": WORDS}], **extra}
    auth = {"Authorization": f"Bearer {_key(tenant)}"}
    answer = httpx.post(runner.url + "/v1/chat/completions", json=body, headers=auth, timeout=30)
    after = httpx.get(engine + "/_fake/stats").json()["tokens_predicted_total"]
    left = int(answer.headers.get("x-ratelimit-remaining-tokens", BUDGET))
    return answer, after - before, BUDGET - left


def test_canonical_vllm_best_of_cannot_run_unreserved_sequences(
    served: tuple[RunnerProcess, str],
) -> None:
    """`best_of: 3` on chat (vLLM runs 3 sequences, returns and counts 1): never more
    generated than reserved; refused 400 unsupported_parameter naming `best_of`."""
    answer, generated, reserved = _send(served, "bestof", best_of=3, max_tokens=10)
    assert generated <= reserved, (generated, reserved)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "best_of"


def test_canonical_vllm_one_completion_and_plain_requests(
    served: tuple[RunnerProcess, str],
) -> None:
    """`n: 2` and `use_beam_search` are refused by name; a plain request with vLLM's own
    sampling fields is served as sent."""
    for extra in ({"n": 2}, {"use_beam_search": True}):
        answer, generated, _ = _send(served, "plain", **extra)
        assert answer.status_code == 400 and generated == 0, answer.text
        assert answer.json()["error"]["param"] == next(iter(extra))
    answer, generated, _ = _send(served, "plain", max_tokens=5, top_k=20, min_tokens=1)
    assert answer.status_code == 200, answer.text
    assert generated == answer.json()["usage"]["completion_tokens"] == 5

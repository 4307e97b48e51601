"""The real vLLM (its CPU build, scripts/install-vllm) failing to start under a runner that
preloads it (docs/reliability.md, section 2): what the adapter reads in vLLM's log
(`adapters/vllm_launch.start_failure_cause`) becomes the model's failure, in words fit for
any tenant; vLLM's own lines stay in the engine's log, for admins.

Two ways the default models file's vLLM entry is made to fail, each a real vLLM error:
- `kv-cache`: `--kv-cache-memory-bytes` of 1 MiB, too small for one request of the model's
  context ("To serve at least one request with the model's max seq len ..."): read as out
  of memory (`EngineOutOfMemory`);
- `context`: a `context_length` above the model's: pydantic's `ValidationError` ("1
  validation error for ModelConfig ... User-specified max_model_len ... is greater than
  the derived max_model_len"), which vLLM 0.32.0 prints for every refused config value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.engines import caps
from tests.support.real_vllm import (
    DEFAULT_ID,
    START_TIMEOUT_S,
    cpu_args,
    default_entry,
    models_file,
)
from tests.support.runner_proc import start_runner, wait_started
from tests.support.tokens import FAIRNESS, gateway_env

pytestmark = pytest.mark.timeout(int(START_TIMEOUT_S) + 300)


@dataclass(frozen=True)
class Broken:
    """One way to make the real vLLM fail at start: the entry's changes, what the failure
    says, and the line of vLLM's own that only the engine's log holds."""

    changes: dict[str, Any]
    says: str
    vllm_says: str


def _args_with_kv_bytes(size: int) -> list[str]:
    args = cpu_args()
    at = args.index("--kv-cache-memory-bytes")
    return [*args[: at + 1], str(size), *args[at + 2 :]]


BROKEN = {
    "kv-cache": Broken(
        {"args": _args_with_kv_bytes(1 << 20)},
        "vLLM ran out of GPU memory while starting",
        "KV cache",
    ),
    "context": Broken(
        {"context_length": 999_999},
        "vLLM failed to start (ValidationError)",
        "max_model_len",
    ),
}


@pytest.mark.parametrize("how", list(BROKEN))
@pytest.mark.usefixtures("real_vllm")
def test_real_vllm_preload_failure_fails_the_model_with_vllms_reason(
    how: str, tmp_path: Path
) -> None:
    """The real vLLM, preloaded, exits while starting: the runner still turns ready
    (capabilities 200); the model is in `models.failed` with the adapter's reading of
    vLLM's error and the exit code, no line of vLLM's log and no path in it; `/health` is
    503 `unhealthy` (its only model) and capabilities' `health` agrees; a request gets 503
    `model_unavailable` with that reason and Retry-After; `GET /v1/models/{id}/logs` shows
    vLLM's own words to admins."""
    broken = BROKEN[how]
    models = models_file(default_entry(preload=True, **broken.changes))
    env = gateway_env()
    with start_runner(models_file=models, env=env, wait_ready=False) as runner:
        wait_started(runner, START_TIMEOUT_S + 60)
        url = runner.url
        doc = caps(url)
        health = httpx.get(url + "/health", timeout=10)
        body = {"model": DEFAULT_ID, "messages": [{"role": "user", "content": "hi"}]}
        refused = httpx.post(
            url + "/v1/chat/completions", json=body, headers={FAIRNESS: "acme"}, timeout=30
        )
        logs = httpx.get(f"{url}/v1/models/{DEFAULT_ID}/logs", headers={FAIRNESS: "ops"})
        log = runner.log()
    [failed] = doc["models"]["failed"]
    error = failed["error"]
    assert failed["id"] == DEFAULT_ID and error.startswith(broken.says), (error, log[-3000:])
    assert "exited while starting" in error and failed["exitCode"] == 1, failed
    assert broken.vllm_says not in error, error
    unsafe = re.sub(r"GET /v1/models/\S+/logs", "", error)
    assert "/" not in unsafe and "Traceback" not in unsafe, error
    assert doc["models"]["loaded"] == [] and doc["health"] == "unhealthy", doc
    assert health.status_code == 503 and health.json()["status"] == "unhealthy", health.text
    assert refused.status_code == 503, refused.text
    refusal = refused.json()["error"]
    assert refusal["code"] == "model_unavailable" and refusal["reason"] == error, refusal
    assert int(refused.headers["Retry-After"]) > 0
    assert logs.status_code == 200, logs.text
    assert any(broken.vllm_says in line for line in logs.json()["lines"]), logs.json()["lines"]

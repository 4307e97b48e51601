"""A governed unload while a request runs, on every engine kind the runner starts
(docs/reliability.md, section 7): the request in flight finishes, new ones get 503
`model_unloading` while the model drains, then 404 `model_not_loaded`. The kinds are the
crash contract's (tests/runner/test_crash_contract.py): llama-server and faster-whisper
real, ComfyUI and vLLM the fakes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.fixtures.fake_vllm import process_env as vllm_env
from tests.runner.test_crash_contract import COMFYUI, LLAMA, VLLM, WHISPER
from tests.support.crash_contract import CrashKind, outcome
from tests.support.engines import GOVERNED, caps, eventually, unload
from tests.support.runner_proc import start_runner, wait_started

pytestmark = pytest.mark.timeout(240)

# The crash contract's busy requests must outlast its set-up (a vLLM fake streaming for a
# minute, 600 tokens from the real Gemma); here they must end: a few seconds are enough.
FASTER = {"vllm-fake": vllm_env(CHUNK_DELAY_MS="10")}


def _short_llama_stream(url: str) -> httpx.Response:
    body = {
        "model": "gemma",
        "messages": [{"role": "user", "content": "Count slowly to twenty."}],
        "max_tokens": 40,
        "stream": True,
    }
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


BUSY = {"llama-server": _short_llama_stream}
KINDS = [LLAMA, WHISPER, COMFYUI, VLLM]


def _in_flight(url: str, model: str) -> bool:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("quorum_requests_in_flight{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1]) >= 1
    return False


def _code(r: httpx.Response) -> tuple[int, str | None]:
    return r.status_code, r.json()["error"]["code"] if r.status_code != 200 else None


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_unload_while_busy_finishes_the_request_and_refuses_new_ones(
    kind: CrashKind, tmp_path: Path
) -> None:
    """Unload with one request in flight: it is answered whole (no error), a request sent
    while the model drains is 503 model_unloading, the unload answers 200, and after it the
    model is not loaded (404)."""
    models = kind.models_file(tmp_path, False)
    env = {**kind.env(tmp_path), **FASTER.get(kind.name, {}), **GOVERNED}
    env["UNLOAD_DRAIN_TIMEOUT_S"] = "180"  # the busy request is never cut here
    with start_runner(
        models_file=models, env=env, wait_ready=False, ready_timeout=kind.ready_timeout
    ) as runner:
        wait_started(runner, kind.ready_timeout)
        url, model = runner.url, kind.model
        eventually(lambda: model in [m["id"] for m in caps(url)["models"]["loaded"]],
                   kind.ready_timeout, f"{model} loaded")  # fmt: skip
        with ThreadPoolExecutor(2) as pool:
            busy = pool.submit(BUSY.get(kind.name, kind.busy), url)
            eventually(lambda: _in_flight(url, model), 60, "the busy request in flight")
            unloading = pool.submit(unload, url, model)
            eventually(
                lambda: _code(kind.quick(url, "late")) == (503, "model_unloading"),
                60,
                "new requests refused while it drains",
            )
            answered = outcome(busy.result(180))
            done = unloading.result(180)
        assert answered.status == 200 and answered.error is None, (kind.name, answered)
        assert done.status_code == 200, done.text
        assert _code(kind.quick(url, "after")) == (404, "model_not_loaded")

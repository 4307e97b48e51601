"""A governed unload while a request runs, on every engine kind the runner starts
(docs/reliability.md, section 7): the request in flight finishes, new ones get 503
`model_unloading` while the model drains, then 404 `model_not_loaded`. The kinds are the
crash contract's (tests/runner/engines/test_crash_contract.py): llama-server and faster-whisper
real, ComfyUI and vLLM the fakes."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.fixtures.fake_vllm import process_env as vllm_env
from tests.runner.engines.test_crash_contract import COMFYUI, LLAMA, VLLM, WHISPER
from tests.support.crash_contract import CrashKind, outcome
from tests.support.engines import GOVERNED, caps, unload
from tests.support.poll import eventually
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


def _long_whole_chat(url: str) -> httpx.Response:
    """The real Gemma asked for 600 tokens, answered whole."""
    body = {
        "model": "gemma",
        "messages": [{"role": "user", "content": "Count slowly to two hundred."}],
        "max_tokens": 600,
    }
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


# A request far longer than a 1 s drain timeout, by kind and shape: 600 tokens from the real
# Gemma (LLAMA.busy streams them), 60 s of speech for the real worker, a minute of the vLLM
# fake's chunks.
LONG = [
    pytest.param(LLAMA, LLAMA.busy, id="llama-server-stream"),
    pytest.param(LLAMA, _long_whole_chat, id="llama-server-whole"),
    pytest.param(WHISPER, WHISPER.busy, id="faster-whisper-whole"),
    pytest.param(VLLM, VLLM.busy, id="vllm-fake-stream"),
]


@pytest.mark.parametrize(("kind", "long_request"), LONG)
def test_unload_drain_timeout_cuts_the_request_with_model_unloading(
    kind: CrashKind, long_request: Callable[[str], httpx.Response], tmp_path: Path
) -> None:
    """Unload while the real engine works on a long request, UNLOAD_DRAIN_TIMEOUT_S=1: when
    the timeout passes the engine is stopped under the request, which is answered 503
    `model_unloading` naming the unload and the drain timeout (a stream: one SSE error
    event with that code, no [DONE]), not the generic 502 `engine_unavailable`; the unload
    answers 200 and the model is not loaded after it."""
    env = {**kind.env(tmp_path), **GOVERNED, "UNLOAD_DRAIN_TIMEOUT_S": "1"}
    with start_runner(
        models_file=kind.models_file(tmp_path, False), env=env, wait_ready=False
    ) as runner:
        wait_started(runner, kind.ready_timeout)
        url, model = runner.url, kind.model
        eventually(lambda: model in [m["id"] for m in caps(url)["models"]["loaded"]],
                   kind.ready_timeout, f"{model} loaded")  # fmt: skip
        with ThreadPoolExecutor(2) as pool:
            busy = pool.submit(long_request, url)
            eventually(lambda: _in_flight(url, model), 60, "the long request in flight")
            done = pool.submit(unload, url, model).result(120)
            cut = busy.result(120)
        after = _code(kind.quick(url, "after"))
        log = runner.log()
    if cut.headers.get("content-type", "").startswith("text/event-stream"):
        assert cut.status_code == 200, cut.text
        events = [line for line in cut.content.split(b"\n") if line.startswith(b"data: ")]
        assert b"[DONE]" not in cut.content, cut.content[-500:]
        assert sum(b'"error"' in e for e in events) == 1 and b'"error"' in events[-1], events
        error = outcome(cut).error
    else:
        assert cut.status_code == 503, (cut.text, log[-3000:])
        error = cut.json()["error"]
    assert error is not None and error["code"] == "model_unloading", (error, log[-3000:])
    assert "unloaded" in error["message"] and "drain timeout (1 s)" in error["message"], error
    assert done.status_code == 200, done.text
    assert after == (404, "model_not_loaded")

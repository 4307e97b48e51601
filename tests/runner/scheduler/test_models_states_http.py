"""What a request for a model gets in each of the model's states, over HTTP on a real
runner process, as docs/api.md ("What a request for a model meets") and the scheduler's
one decision (`runner/scheduler/models.admission`) say.

Stand-in llama-servers (tests/fixtures/bin/): `paced` streams 30 chunks 100 ms apart, so
a request stays in flight long enough to watch a model drain; `slow` takes 3 s to load;
`slow-paced` does both; `exits-at-start` never comes up. A crash is a real SIGKILL of the
engine process the runner started.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, fixture_bin, start_runner
from tests.support.tokens import DEV_REGISTRY, dev_token

pytestmark = pytest.mark.timeout(180)

ENV = {"GOVERNANCE_REGISTRY": str(DEV_REGISTRY)}
HUGE_MB = 1 << 40  # more memory than any machine has: no eviction makes room


def _entry(model: str, binary: str, vram_mb: int = 64, **extra: object) -> str:
    lines = [f"  - id: {model}", "    backend: llama-server", "    path: /dev/null"]
    lines += [f"    bin: {fixture_bin(binary)}", f"    vram_mb: {vram_mb}"]
    lines += [f"    {k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def _governed(url: str, op: str, model: str, **fields: Any) -> httpx.Response:
    path = {"model-load": "/v1/models/load", "model-unload": "/v1/models/unload"}[op]
    token = dev_token(op, model, fields)
    body = {"modelId": model, **fields, "verifiedOpToken": token}
    return httpx.post(url + path, json=body, timeout=60)


def _chat(url: str, model: str, stream: bool = False) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60)


def _state(url: str, model: str) -> str:
    caps = httpx.get(url + "/v1/capabilities").json()["models"]
    for kind in ("loaded", "loading", "failed"):
        if any(m["id"] == model for m in caps[kind]):
            return kind
    return "available"


def _error(r: httpx.Response) -> tuple[int, str]:
    return r.status_code, r.json()["error"]["code"]


class Streaming:
    """A streamed chat in a thread: `started` once its first chunk came, `body` at the end."""

    def __init__(self, url: str, model: str) -> None:
        self.started = threading.Event()
        self.body = b""
        self.thread = threading.Thread(target=self._run, args=(url, model))
        self.thread.start()
        assert self.started.wait(30), "the stream never started"

    def _run(self, url: str, model: str) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            for chunk in r.iter_bytes():
                self.started.set()
                self.body += chunk

    def finish(self) -> bytes:
        self.thread.join(60)
        return self.body


class Waiting:
    """A chat request in a thread (it may wait in the queue); `answer()` once it came."""

    def __init__(self, url: str, model: str) -> None:
        self.pool = ThreadPoolExecutor(1)
        self.future = self.pool.submit(_chat, url, model)

    def answer(self) -> httpx.Response:
        try:
            return self.future.result(60)
        finally:
            self.pool.shutdown()


def _queue_depth(url: str) -> int:
    depth: int = httpx.get(url + "/health").json()["queueDepth"]
    return depth


def _engine_pid(runner: RunnerProcess, model: str) -> int:
    """The engine process the runner started for `model` (its child, `--alias model`)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        alias = argv[argv.index("--alias") + 1] if "--alias" in argv else None
        if ppid == runner.proc.pid and alias == model:
            return int(entry.name)
    raise AssertionError(f"no engine process for {model}")


@pytest.fixture(scope="module")
def runner() -> Iterator[RunnerProcess]:
    models = "models:\n" + "".join(
        [
            _entry("p", "llama-server-paced"),
            _entry("slow", "llama-server-slow"),
            _entry("broken", "llama-server-exits-at-start"),
            _entry("e1", "llama-server-paced"),
            _entry("e2", "llama-server-ok"),
            _entry("a1", "llama-server-paced", autoload=True),
            _entry("a2", "llama-server-ok"),
            _entry("walk", "llama-server-slow-paced", parallel=1, restart=False),
            _entry("walk-other", "llama-server-ok"),
            _entry("phoenix", "llama-server-paced", parallel=1, restart=True),
            _entry("dud", "llama-server-exits-at-start", autoload=True),
            _entry("huge", "llama-server-ok", vram_mb=HUGE_MB, autoload=True),
        ]
    )
    with start_runner(models_file=models, env=ENV) as r:
        yield r


def test_model_states_unknown_and_not_loaded_are_404(runner: RunnerProcess) -> None:
    """Not a model of this runner: 404 model_not_found naming the models; a model of the
    catalog that is not loaded (and not autoload): 404 model_not_loaded."""
    r = _chat(runner.url, "nope")
    assert _error(r) == (404, "model_not_found") and "slow" in r.json()["error"]["message"]
    assert _error(_chat(runner.url, "p")) == (404, "model_not_loaded")


def test_model_states_failed_is_503_with_the_reason(runner: RunnerProcess) -> None:
    """A model whose engine failed: 503 model_unavailable with the reason and Retry-After."""
    assert _governed(runner.url, "model-load", "broken").status_code == 202
    eventually(lambda: _state(runner.url, "broken") == "failed")
    r = _chat(runner.url, "broken")
    assert _error(r) == (503, "model_unavailable")
    assert "exited while starting" in r.json()["error"]["reason"]
    assert int(r.headers["Retry-After"]) > 0


def test_model_states_loading_waits_then_ready_serves(runner: RunnerProcess) -> None:
    """A request for a loading model waits in the queue and is served once it is ready;
    a ready model serves at once."""
    assert _governed(runner.url, "model-load", "slow").status_code == 202
    assert _state(runner.url, "slow") == "loading"
    r = _chat(runner.url, "slow")
    assert r.status_code == 200 and int(r.headers["X-Queue-Wait-Ms"]) > 0
    r = _chat(runner.url, "slow")
    assert r.status_code == 200 and r.headers["X-Queue-Wait-Ms"] == "0"


def test_model_states_draining_for_unload_is_503_unloading(runner: RunnerProcess) -> None:
    """While a model drains for a governed unload, new requests get 503 model_unloading;
    the one in flight finishes; then it is not loaded (404)."""
    assert _governed(runner.url, "model-load", "p").status_code == 202
    eventually(lambda: _state(runner.url, "p") == "loaded")
    stream = Streaming(runner.url, "p")
    unload: list[httpx.Response] = []
    worker = threading.Thread(
        target=lambda: unload.append(_governed(runner.url, "model-unload", "p"))
    )
    worker.start()
    eventually(lambda: _error(_chat(runner.url, "p")) == (503, "model_unloading"))
    assert stream.finish().rstrip().endswith(b"data: [DONE]")
    worker.join(60)
    assert unload and unload[0].status_code == 200
    assert _error(_chat(runner.url, "p")) == (404, "model_not_loaded")


def test_model_states_evicted_model_is_503_unloading(runner: RunnerProcess) -> None:
    """A model evicted for another (`evictModel`) drains: new requests for it get 503
    model_unloading (it does not come back by itself); the model it made room for loads."""
    assert _governed(runner.url, "model-load", "e1").status_code == 202
    eventually(lambda: _state(runner.url, "e1") == "loaded")
    stream = Streaming(runner.url, "e1")
    assert _governed(runner.url, "model-load", "e2", evictModel="e1").status_code == 202
    eventually(lambda: _error(_chat(runner.url, "e1")) == (503, "model_unloading"))
    assert stream.finish().rstrip().endswith(b"data: [DONE]")
    eventually(lambda: _state(runner.url, "e2") == "loaded")
    assert _error(_chat(runner.url, "e1")) == (404, "model_not_loaded")


def test_model_states_evicted_autoload_model_waits_and_comes_back(runner: RunnerProcess) -> None:
    """An `autoload` model evicted for another drains: a request for it waits, and is
    served once it is loaded again after the other."""
    assert _governed(runner.url, "model-load", "a1").status_code == 202
    eventually(lambda: _state(runner.url, "a1") == "loaded")
    stream = Streaming(runner.url, "a1")
    assert _governed(runner.url, "model-load", "a2", evictModel="a1").status_code == 202
    eventually(lambda: "evict a1" in runner.log(), timeout=60)
    waiting = _chat(runner.url, "a1")  # waits through the drain, the stop and the reload
    assert waiting.status_code == 200 and int(waiting.headers["X-Queue-Wait-Ms"]) > 0
    assert stream.finish().rstrip().endswith(b"data: [DONE]")
    eventually(lambda: _state(runner.url, "a2") == "loaded")
    assert _state(runner.url, "a1") == "loaded"


def _unavailable(r: httpx.Response) -> str:
    """The reason of a 503 `model_unavailable` carrying `Retry-After: 30` (docs/api.md)."""
    assert _error(r) == (503, "model_unavailable"), r.text
    assert r.headers["Retry-After"] == "30"
    reason: str = r.json()["error"]["reason"]
    return reason


def test_model_states_one_model_walks_every_state(runner: RunnerProcess) -> None:
    """One model through every state in turn, with the exact answer docs/api.md gives in
    each: not loaded 404 model_not_loaded; loading: waits, then 200; ready 200; draining
    for an unload 503 model_unloading; not loaded 404; loaded again, then evicted for
    another model 503 model_unloading, then 404; loaded again, then crashed without
    restart: the request queued at the crash and new ones 503 model_unavailable with the
    reason and Retry-After: 30."""
    url, model = runner.url, "walk"
    # not loaded
    assert _error(_chat(url, model)) == (404, "model_not_loaded")
    # loading (3 s): a request waits in the queue, then is served
    assert _governed(url, "model-load", model).status_code == 202
    assert _state(url, model) == "loading"
    waited = _chat(url, model)
    assert waited.status_code == 200 and int(waited.headers["X-Queue-Wait-Ms"]) > 0
    # ready
    served = _chat(url, model)
    assert served.status_code == 200 and served.headers["X-Queue-Wait-Ms"] == "0"
    # draining for a governed unload, then not loaded
    stream = Streaming(url, model)
    unload = ThreadPoolExecutor(1)
    unloaded = unload.submit(_governed, url, "model-unload", model)
    eventually(lambda: _error(_chat(url, model)) == (503, "model_unloading"))
    assert stream.finish().rstrip().endswith(b"data: [DONE]")
    assert unloaded.result(60).status_code == 200
    unload.shutdown()
    assert _error(_chat(url, model)) == (404, "model_not_loaded")
    # loaded again, then evicted for another model, then not loaded
    assert _governed(url, "model-load", model).status_code == 202
    eventually(lambda: _state(url, model) == "loaded")
    stream = Streaming(url, model)
    assert _governed(url, "model-load", "walk-other", evictModel=model).status_code == 202
    eventually(lambda: _error(_chat(url, model)) == (503, "model_unloading"))
    assert stream.finish().rstrip().endswith(b"data: [DONE]")
    eventually(lambda: _state(url, "walk-other") == "loaded")
    assert _error(_chat(url, model)) == (404, "model_not_loaded")
    # loaded again, then its engine crashes (no restart): failed
    assert _governed(url, "model-load", model).status_code == 202
    eventually(lambda: _state(url, model) == "loaded")
    stream = Streaming(url, model)  # holds the one slot
    queued = Waiting(url, model)
    eventually(lambda: _queue_depth(url) >= 1)
    os.kill(_engine_pid(runner, model), signal.SIGKILL)
    assert "SIGKILL" in _unavailable(queued.answer())
    assert b"engine_crashed" in stream.finish()
    assert _state(url, model) == "failed"
    assert "SIGKILL" in _unavailable(_chat(url, model))


def test_model_states_crashed_with_restart_due_waits(runner: RunnerProcess) -> None:
    """A `restart` model whose engine crashed: the request queued at the crash and one
    sent while the restart is due wait in the queue, and the restarted engine serves
    both (docs/api.md: failed, a restart due, waits)."""
    url, model = runner.url, "phoenix"
    assert _governed(url, "model-load", model).status_code == 202
    eventually(lambda: _state(url, model) == "loaded")
    stream = Streaming(url, model)  # holds the one slot
    queued = Waiting(url, model)
    eventually(lambda: _queue_depth(url) >= 1)
    os.kill(_engine_pid(runner, model), signal.SIGKILL)
    eventually(lambda: f"restart {model} in" in runner.log())
    later = _chat(url, model)
    assert later.status_code == 200 and int(later.headers["X-Queue-Wait-Ms"]) > 0
    answer = queued.answer()
    assert answer.status_code == 200 and int(answer.headers["X-Queue-Wait-Ms"]) > 0
    assert b"engine_crashed" in stream.finish()
    assert _state(url, model) == "loaded"


def test_model_states_queued_for_a_failed_load_is_503_load_failed(runner: RunnerProcess) -> None:
    """A request waiting for a load (autoload) that fails is refused with 503
    model_load_failed, the reason and Retry-After (docs/api.md)."""
    r = _chat(runner.url, "dud")
    assert _error(r) == (503, "model_load_failed"), r.text
    assert "exited while starting" in r.json()["error"]["reason"]
    assert r.headers["Retry-After"] == "30"


def test_model_states_queued_for_a_load_that_cannot_fit_is_503(runner: RunnerProcess) -> None:
    """A request waiting for a load (autoload) that no eviction can make room for is
    refused with 503 model_does_not_fit, the reason and Retry-After (docs/api.md)."""
    r = _chat(runner.url, "huge")
    assert _error(r) == (503, "model_does_not_fit"), r.text
    assert str(HUGE_MB) in r.json()["error"]["reason"]
    assert int(r.headers["Retry-After"]) > 0

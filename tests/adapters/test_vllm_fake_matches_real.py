"""The fake vLLM answers in the real vLLM 0.32.0's shapes (issue 15, point 4).

One real engine (PyPI's CPU build, scripts/install-vllm) and one fake for the module, both
started with the same command line; the same requests go to both and the answers' shapes
are compared: status, content type, the keys and JSON types of bodies (recursively), SSE
framing, error bodies, and the `/metrics` families the runner reads. Values (text, ids,
timestamps, counts) are not compared. Where the two differ, the fake is what gets fixed:
docs/engines.md ("The fake vs the real 0.32.0") lists what this test found.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.vllm.kind import keep_model_info
from tests.fixtures.fake_vllm import BIN, process_env
from tests.support.ports import free_port
from tests.support.real_vllm import MODEL_DIR, MODEL_INFO_DIR, START_TIMEOUT_S, VLLM_BIN, cpu_args

START_S = 2 * START_TIMEOUT_S
"""A run here with the 2 cores at load 11 (other real engines starting) errored at set-up
after 240 s; the next passed. The wait ends as soon as `/health` answers."""
pytestmark = pytest.mark.timeout(START_S + 120)

KEY = "k-shapes"
MODEL = "m"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = "The quick brown fox jumps over the lazy dog near the old river bank. " * 50
"""About 750 tokens for Gemma's tokenizer (650 for the fake's): several full KV blocks."""
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
TEXT = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4}
USAGE = {"stream": True, "stream_options": {"include_usage": True}}
PLAIN = {**AUTH, "Content-Type": "text/plain"}
WATCHED_FAMILIES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_hits",
    "vllm:prefix_cache_queries",
)
"""The `/metrics` families the runner reads (adapters/vllm/metrics.py)."""


def shape(value: Any) -> Any:
    """A JSON value's structure: an object keeps its keys with their values' shapes, an
    array the distinct shapes of its items (in order), a scalar its JSON type's name."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        out: list[Any] = []
        for item in value:
            s = shape(item)
            if s not in out:
                out.append(s)
        return out
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"


def differences(real: Any, fake: Any, path: str = "$") -> list[str]:
    """Where two shapes differ, one line per place (`path: real ..., fake ...`)."""
    if isinstance(real, dict) and isinstance(fake, dict):
        out = [f"{path}.{k}: only in the real engine" for k in real if k not in fake]
        out += [f"{path}.{k}: only in the fake" for k in fake if k not in real]
        for k in real.keys() & fake.keys():
            out += differences(real[k], fake[k], f"{path}.{k}")
        return out
    if isinstance(real, list) and isinstance(fake, list) and len(real) == len(fake):
        pairs = enumerate(zip(real, fake, strict=True))
        return [d for i, (r, f) in pairs for d in differences(r, f, f"{path}[{i}]")]
    return [] if real == fake else [f"{path}: real {real!r}, fake {fake!r}"]


def body_shape(content: bytes) -> Any:
    """An answer body's shape: "empty", the shape of its JSON, or "text"."""
    if not content:
        return "empty"
    try:
        return shape(orjson.loads(content))
    except orjson.JSONDecodeError:
        return "text"


def sse_shape(text: str) -> list[Any]:
    """A stream's events: each `data: ` event's JSON shape, consecutive repeats once (the
    number of content chunks is a value, not a shape), `[DONE]` as itself, and anything
    that is not a `data: ` event framed by a blank line as `not an event`."""
    events: list[Any] = []
    frames = text.split("\n\n")
    for frame in frames[:-1]:
        if not frame.startswith("data: ") or "\n" in frame:
            s: Any = ("not an event", frame[:40])
        elif frame == "data: [DONE]":
            s = "[DONE]"
        else:
            s = body_shape(frame.removeprefix("data: ").encode())
        if not events or events[-1] != s:
            events.append(s)
    if frames[-1]:
        events.append(("unterminated", frames[-1][:40]))
    return events


def answer_shape(r: httpx.Response) -> dict[str, Any]:
    """Status, content type and the body's (or the stream's) shape."""
    ctype = r.headers.get("content-type")
    out: dict[str, Any] = {"status": r.status_code, "content-type": ctype}
    if ctype and ctype.startswith("text/event-stream"):
        out["events"] = sse_shape(r.text)
    else:
        out["body"] = body_shape(r.content)
    return out


def metrics_shape(text: str) -> dict[str, Any]:
    """The watched `/metrics` families (and their `_created` siblings): their type, and each
    sample's name and label names."""
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        if family.name.removesuffix("_created") in WATCHED_FAMILIES:
            samples = sorted({(s.name, tuple(sorted(s.labels))) for s in family.samples})
            out[family.name] = {"type": family.type, "samples": samples}
    return out


@dataclass(frozen=True)
class Case:
    """One request, sent as it is to both engines."""

    name: str
    method: str
    path: str
    body: dict[str, Any] | None = None
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=lambda: dict(AUTH))


CASES = [
    Case("chat-whole", "POST", "/v1/chat/completions", CHAT),
    Case("chat-stream", "POST", "/v1/chat/completions", {**CHAT, "stream": True}),
    Case("chat-stream-usage", "POST", "/v1/chat/completions", {**CHAT, **USAGE}),
    Case("text-whole", "POST", "/v1/completions", TEXT),
    Case("text-stream", "POST", "/v1/completions", {**TEXT, "stream": True}),
    Case("text-stream-usage", "POST", "/v1/completions", {**TEXT, **USAGE}),
    Case("empty-cache-salt", "POST", "/v1/chat/completions", {**CHAT, "cache_salt": ""}),
    Case("unknown-model", "POST", "/v1/chat/completions", {**CHAT, "model": "nope"}),
    Case("unknown-model-stream", "POST", "/v1/completions", {**TEXT, **USAGE, "model": "no"}),
    Case("max-tokens-too-large", "POST", "/v1/completions", {**TEXT, "max_tokens": 4096}),
    Case("prompt-too-long", "POST", "/v1/completions", {**TEXT, "prompt": LONG * 4}),
    Case("options-without-stream", "POST", "/v1/completions", {**TEXT, **USAGE, "stream": False}),
    Case("missing-messages", "POST", "/v1/chat/completions", {"model": MODEL}),
    Case("bad-json", "POST", "/v1/chat/completions", raw=b'{"model": "m", "messages": ['),
    Case("not-json", "POST", "/v1/chat/completions", raw=orjson.dumps(CHAT), headers=PLAIN),
    Case("no-api-key", "POST", "/v1/chat/completions", CHAT, headers={}),
    Case("models", "GET", "/v1/models"),
    Case("version", "GET", "/version"),
    Case("health", "GET", "/health"),
    Case("is-sleeping", "GET", "/is_sleeping"),
    Case("reset-prefix-cache", "POST", "/reset_prefix_cache"),
    Case("sleep-bad-level", "POST", "/sleep?level=5"),
]


@dataclass(frozen=True)
class Engine:
    """A vLLM (real or fake) serving `MODEL` on `url`, with `KEY`."""

    url: str

    def send(self, case: Case) -> httpx.Response:
        headers = dict(case.headers)
        content = case.raw
        if case.body is not None:
            content = orjson.dumps({"temperature": 0, **case.body})
        if content is not None:
            headers.setdefault("Content-Type", "application/json")
        return httpx.request(
            case.method, self.url + case.path, content=content, headers=headers, timeout=120
        )


def serve_argv(binary: Path, port: int) -> list[str]:
    """The command line both engines get: the runner's flags (adapters/vllm/launch.py) and
    the CPU ones of the default models file."""
    return [
        str(binary), "serve", str(MODEL_DIR), "--host", "127.0.0.1", "--port", str(port),
        "--api-key", KEY, "--served-model-name", MODEL, "--max-num-seqs", "4",
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--enable-per-request-metrics", "--max-model-len", "2048", *cpu_args(),
    ]  # fmt: skip


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout: float, log: Path) -> None:
    """Poll `/health` until it answers 200; fail with the log's tail if the process exits
    or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            pytest.fail(f"engine exited with {proc.returncode} before it was healthy:\n{tail}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-3000:]
    pytest.fail(f"engine not healthy within {timeout:.0f} s:\n{tail}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the engine's process group (vLLM's engine core is a child), SIGKILL it if
    it is still there after 30 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass
    with contextlib.suppress(ProcessLookupError):  # children that outlived the leader
        os.killpg(proc.pid, signal.SIGKILL)


def _start(argv: list[str], env: dict[str, str], timeout: float) -> Iterator[Engine]:
    scratch = Path(tempfile.mkdtemp(prefix="quorum-vllm-shapes-"))
    (scratch / "cache").mkdir()
    (scratch / "tmp").mkdir()
    keep_model_info(str(scratch), str(MODEL_INFO_DIR))  # as the tests' runners do
    env = {
        **os.environ, **env, "VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(scratch / "cache"),
        "TMPDIR": str(scratch / "tmp"),
    }  # fmt: skip
    log = scratch / "engine.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
    try:
        _wait_healthy(proc, url, timeout, log)
        yield Engine(url)
    finally:
        _stop(proc)
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(scope="module")
def real(real_vllm: None) -> Iterator[Engine]:
    yield from _start(serve_argv(VLLM_BIN, free_port()), {}, START_S)


@pytest.fixture(scope="module")
def fake() -> Iterator[Engine]:
    yield from _start(serve_argv(BIN, free_port()), process_env(), 30.0)


def _assert_same_shape(real: Any, fake: Any) -> None:
    found = differences(real, fake)
    assert not found, "the fake differs from the real vLLM:\n" + "\n".join(found)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_vllm_fake_answers_like_real(real: Engine, fake: Engine, case: Case) -> None:
    """The fake answers each request with the real engine's status, content type and shape."""
    _assert_same_shape(answer_shape(real.send(case)), answer_shape(fake.send(case)))


def test_vllm_real_stream_framing(real: Engine) -> None:
    """The real engine frames a stream as `data: ` events, a `choices: []` usage event when
    asked, then `data: [DONE]` (what the fake's shape is compared against)."""
    r = real.send(Case("s", "POST", "/v1/chat/completions", {**CHAT, **USAGE}))
    assert r.text.endswith("\n\ndata: [DONE]\n\n")
    events = [orjson.loads(e.removeprefix("data: ")) for e in r.text.split("\n\n")[:-2]]
    assert events[-1]["choices"] == [] and "usage" in events[-1]
    assert all(e["choices"] for e in events[:-1])


def test_vllm_fake_reports_cached_tokens_like_real(real: Engine, fake: Engine) -> None:
    """A repeated long prompt reports cached tokens (> 0) in the same usage shape, whole
    and in the stream's usage event."""
    whole = Case("long", "POST", "/v1/completions", {**TEXT, "prompt": LONG})
    streamed = Case("long-stream", "POST", "/v1/completions", {**TEXT, "prompt": LONG, **USAGE})
    for case in (whole, streamed):
        answers = {}
        for name, engine in (("real", real), ("fake", fake)):
            engine.send(case)
            again = engine.send(case)
            text = again.text
            if case is streamed:  # the usage event, before `data: [DONE]`
                text = text.split("\n\n")[-3].removeprefix("data: ")
            cached = orjson.loads(text)["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached > 0, f"{name}: {text}"
            answers[name] = answer_shape(again)
        _assert_same_shape(answers["real"], answers["fake"])


def test_vllm_fake_metrics_like_real(real: Engine, fake: Engine) -> None:
    """`/metrics` has the families the runner reads with the real engine's types, sample
    names (`_total`, `_created`) and label names, in the same content type."""
    r, f = httpx.get(real.url + "/metrics"), httpx.get(fake.url + "/metrics")
    assert r.status_code == f.status_code == 200
    real_families = metrics_shape(r.text)
    assert set(WATCHED_FAMILIES) <= set(real_families)
    _assert_same_shape(
        {"content-type": r.headers["content-type"], "families": real_families},
        {"content-type": f.headers["content-type"], "families": metrics_shape(f.text)},
    )

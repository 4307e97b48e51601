"""The one table of engine kinds (runner/engines/kinds.py): built-in kinds and those
ENGINE_KINDS registers, each entry of the models file checked by its kind; and two kinds
defined only in tests, a chat kind (tests/fixtures/parrot_kind.py) and a speech kind
(tests/fixtures/mynah_kind.py), each served end to end by a real runner process, with
nothing of them under runner/."""

from __future__ import annotations

import io
import wave
from typing import Any

import httpx
import pytest

from adapters.kind import EngineSettings
from runner.engines.kinds import EngineKinds, registered
from runner.errors import ConfigError
from runner.floor.models_file import ModelSpec
from tests.fixtures.mynah_kind import ENGINE_MS, MynahKind
from tests.fixtures.parrot_kind import ParrotKind
from tests.support.engines import GOVERNED, caps, flush, load_and_wait, processes_with, unload
from tests.support.poll import eventually
from tests.support.runner_proc import start_runner

PARROT = "tests.fixtures.parrot_kind:ParrotKind"
MYNAH = "tests.fixtures.mynah_kind:MynahKind"


def test_kinds_registered_by_module_and_attribute() -> None:
    """ENGINE_KINDS names factories as module:attr; a bad entry is a ConfigError naming it."""
    assert registered(f" {PARROT}, ") == [ParrotKind]
    for bad in ("tests.fixtures.parrot_kind", "no_such_module_q:X", "tests.fixtures:nope"):
        with pytest.raises(ConfigError, match="ENGINE_KINDS"):
            registered(bad)


def test_kinds_table_checks_entries_by_their_kind() -> None:
    """An entry's backend names a kind (else the supported ones are listed); a field only
    some kinds read is refused elsewhere; the kind's own checks apply."""
    kinds = EngineKinds(EngineSettings(), [ParrotKind])
    kinds.check(ModelSpec(id="p", backend="parrot"))
    assert kinds.slots(ModelSpec(id="p", backend="parrot")) == 3
    with pytest.raises(ConfigError, match="supported: comfyui, faster-whisper, llama-server"):
        kinds.check(ModelSpec(id="t", backend="tgi"))
    with pytest.raises(ConfigError, match="workflow applies to backend 'comfyui' only"):
        kinds.check(ModelSpec(id="p", backend="parrot", workflow="txt2img"))
    with pytest.raises(ConfigError, match="started by the runner: no url"):
        kinds.check(ModelSpec(id="p", backend="parrot", url="http://h:1"))


def test_kinds_default_backend_of_a_load_by_path() -> None:
    """A model named by a path loads on llama-server, or on vLLM when the models file
    starts vLLM models and no llama-server."""
    kinds = EngineKinds()

    def spec(backend: str, **more: Any) -> ModelSpec:
        return ModelSpec.model_validate({"id": backend, "backend": backend, **more})

    assert kinds.default_backend([]) == "llama-server"
    assert kinds.default_backend([spec("vllm", hf="o/v")]) == "vllm"
    both = [spec("vllm", hf="o/v"), spec("llama-server", path="/m.gguf")]
    assert kinds.default_backend(both) == "llama-server"
    assert kinds.default_backend([spec("vllm", url="http://h:1")]) == "llama-server"


CHAT = {"model": "p1", "messages": [{"role": "user", "content": "hello"}]}


def _probed(runner_pid: int) -> int:
    """How often the parrot engine was asked its own probe, `/ping`."""
    [(_, argv)] = processes_with("tests.fixtures.fake_parrot", parent=runner_pid)
    port = argv[argv.index("--port") + 1]
    stats = httpx.get(f"http://127.0.0.1:{port}/_fake/stats").json()
    return int(stats["by_path"].get("/ping", 0))


@pytest.mark.timeout(120)
def test_kinds_a_kind_defined_in_tests_is_served_end_to_end() -> None:
    """The test-only `parrot` kind, registered with ENGINE_KINDS: a governed load starts its
    engine; chat answers, a stream is refused by the kind (400); capabilities show its
    version and its own flags; it is probed on its own path; a flush finds nothing of it;
    the image path refuses it (its path is chat); unload stops it."""
    models = "models:\n  - id: p1\n    backend: parrot\n"
    env = {**GOVERNED, "ENGINE_KINDS": PARROT, "ENGINE_STATS_INTERVAL_S": "0.2"}
    with start_runner(models_file=models, env=env) as runner:
        url = runner.url
        assert load_and_wait(url, "p1")["status"] == "completed"
        r = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "echo: hello"
        streamed = httpx.post(url + "/v1/chat/completions", json={**CHAT, "stream": True})
        assert streamed.status_code == 400
        assert streamed.json()["error"]["code"] == "unsupported_parameter"
        doc = eventually(lambda: (d := caps(url))["runnerType"] == "parrot-7.7.7" and d)
        assert [m["id"] for m in doc["models"]["loaded"]] == ["p1"]
        assert doc["capabilities"] == {
            "streaming": False,
            "prefixCaching": False,
            "multiTenant": True,
            "visionInput": True,
            "audioInput": False,
            "functionCalling": True,
        }
        eventually(lambda: _probed(runner.proc.pid) > 0, what="the parrot's own probe")
        assert flush(url, "model", modelId="p1").status_code == 404
        assert flush(url, "all").json()["flushed"] is False
        image = httpx.post(url + "/v1/images/generations", json={"model": "p1", "prompt": "x"})
        assert image.status_code == 400 and image.json()["error"]["code"] == "unsupported_model"
        assert unload(url, "p1").status_code == 200
        assert caps(url)["models"]["loaded"] == []
        assert processes_with("tests.fixtures.fake_parrot", parent=runner.proc.pid) == []


def _wav(seconds: float, rate: int = 16_000) -> bytes:
    """`seconds` of silence as a 16-bit mono WAV file."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\0\0" * round(seconds * rate))
    return out.getvalue()


def _speech(url: str, path: str = "/v1/audio/transcriptions", **fields: str) -> httpx.Response:
    files = {"file": ("two.wav", _wav(2.5), "audio/wav")}
    return httpx.post(url + path, data={"model": "m1", **fields}, files=files, timeout=30)


def test_kinds_speech_kind_checked_by_the_table() -> None:
    """The speech kind registered with the table: its slots and its own checks apply."""
    kinds = EngineKinds(EngineSettings(), [MynahKind])
    kinds.check(ModelSpec(id="m", backend="mynah"))
    assert kinds.slots(ModelSpec(id="m", backend="mynah")) == 2
    assert kinds.named("mynah").traits.request_path == "audio"
    with pytest.raises(ConfigError, match="whisper_model applies to backend 'faster-whisper'"):
        kinds.check(ModelSpec(id="m", backend="mynah", whisper_model="tiny.en"))
    with pytest.raises(ConfigError, match="started by the runner: no url"):
        kinds.check(ModelSpec(id="m", backend="mynah", url="http://h:1"))


@pytest.mark.timeout(120)
def test_kinds_a_speech_kind_defined_in_tests_is_served_end_to_end() -> None:
    """The test-only speech kind `mynah`, registered with ENGINE_KINDS: a governed load
    starts it; /v1/audio/transcriptions and /translations answer its segments (json,
    verbose_json, text, a stream) with its engine time; capabilities show its version and
    audio input; the chat path refuses it (its path is audio); unload stops it."""
    models = "models:\n  - id: m1\n    backend: mynah\n"
    env = {**GOVERNED, "ENGINE_KINDS": MYNAH, "ENGINE_STATS_INTERVAL_S": "0.2"}
    with start_runner(models_file=models, env=env) as runner:
        url = runner.url
        assert load_and_wait(url, "m1")["status"] == "completed"
        r = _speech(url)
        assert r.status_code == 200, r.text
        assert r.json()["text"] == "mynah 1 mynah 2"
        assert r.headers["x-gpu-time-ms"] == str(ENGINE_MS)
        verbose = _speech(url, response_format="verbose_json", language="fr").json()
        assert (verbose["language"], verbose["duration"]) == ("french", 2.5)
        assert [s["text"] for s in verbose["segments"]] == [" mynah 1", " mynah 2"]
        text = _speech(url, "/v1/audio/translations", response_format="text")
        assert text.status_code == 200 and text.text.strip() == "mynah 1 mynah 2"
        streamed = _speech(url, stream="true")
        assert streamed.status_code == 200, streamed.text
        assert streamed.headers["content-type"].startswith("text/event-stream")
        assert "transcript.text.done" in streamed.text
        doc = eventually(lambda: (d := caps(url))["runnerType"] == "mynah-0.3" and d)
        assert [m["id"] for m in doc["models"]["loaded"]] == ["m1"]
        assert doc["capabilities"]["audioInput"] is True
        assert doc["capabilities"]["streaming"] is False
        chat = httpx.post(url + "/v1/chat/completions", json={**CHAT, "model": "m1"})
        assert chat.status_code == 400 and chat.json()["error"]["code"] == "unsupported_model"
        assert unload(url, "m1").status_code == 200
        assert caps(url)["models"]["loaded"] == []

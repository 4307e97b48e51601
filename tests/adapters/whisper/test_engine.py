"""WhisperEngine with the real worker and the real tiny.en model, on espeak-ng speech."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from adapters.errors import (
    EngineCrashed,
    EngineSilent,
    EngineStartFailed,
    EngineUnavailable,
    InvalidAudio,
)
from adapters.speech import Segment
from adapters.supervisor import EngineState
from adapters.whisper.engine import WhisperEngine
from adapters.whisper.errors import TranscriptionCancelled
from tests.adapters.whisper.speech import SpeechFiles, has_words, tree_rss_bytes

pytestmark = pytest.mark.asyncio(loop_scope="module")


def _engine(model: str, name: str = "whisper", parallel: int = 2) -> WhisperEngine:
    return WhisperEngine(name, model, parallel=parallel, cpu_threads=1, load_timeout_s=60)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(whisper_model: str) -> AsyncIterator[WhisperEngine]:
    """One engine (2 parallel slots) shared by the module's tests."""
    e = _engine(whisper_model)
    await e.start()
    yield e
    await e.stop()


async def _text(engine: WhisperEngine, path: str, **kw: object) -> tuple[str, list[Segment]]:
    async with engine.transcribe(path, request_id="t", **kw) as t:  # type: ignore[arg-type]
        segments = [s async for s in t]
    return "".join(s.text for s in segments), segments


async def test_engine_transcribes_spoken_words(engine: WhisperEngine, speech: SpeechFiles) -> None:
    """espeak-ng's "hello world, one two three" comes back as text with those words."""
    async with engine.transcribe(str(speech.hello), request_id="hello") as t:
        info = await t.wait_info()
        segments = [s async for s in t]
    assert info.language == "en" and 2.0 < info.duration < 5.0
    text = "".join(s.text for s in segments)
    assert has_words(text), text
    assert all(0 <= s.start <= s.end <= info.duration + 0.5 for s in segments)
    assert t.done is not None and t.done.error is None and t.done.engine_ms > 0
    assert engine.in_flight == 0


async def test_engine_word_timestamps_when_asked(
    engine: WhisperEngine, speech: SpeechFiles
) -> None:
    """word_timestamps=True brings words with start <= end inside each segment."""
    _, segments = await _text(engine, str(speech.hello), word_timestamps=True)
    words = [w for s in segments for w in s.words or ()]
    assert words and all(w.start <= w.end for w in words)
    _, plain = await _text(engine, str(speech.hello))
    assert all(s.words is None for s in plain)


async def test_engine_serves_requests_side_by_side(
    engine: WhisperEngine, speech: SpeechFiles
) -> None:
    """Two transcriptions at once (parallel=2) both complete with the spoken words."""
    texts = await asyncio.gather(*(_text(engine, str(speech.hello)) for _ in range(2)))
    assert all(has_words(text) for text, _ in texts)


async def test_engine_bad_audio_is_a_400_and_the_worker_lives(
    engine: WhisperEngine, speech: SpeechFiles
) -> None:
    """An undecodable file fails that request with InvalidAudio; the same worker serves on."""
    pid = engine.pid
    with pytest.raises(InvalidAudio) as caught:
        await _text(engine, str(speech.bad_mp3))
    assert "no decodable audio" in str(caught.value)
    text, _ = await _text(engine, str(speech.hello))
    assert has_words(text) and engine.pid == pid and engine.state is EngineState.READY


async def test_engine_cancel_stops_a_long_transcription(
    engine: WhisperEngine, speech: SpeechFiles
) -> None:
    """cancel() after the first segment ends the request early with TranscriptionCancelled."""
    seen = 0
    async with engine.transcribe(str(speech.long), request_id="long") as t:
        info = await t.wait_info()
        with pytest.raises(TranscriptionCancelled):
            async for _ in t:
                seen += 1
                if seen == 1:
                    engine.cancel(t.request_id)
    assert info.duration > 50 and t.seconds_done < info.duration
    assert any("cancelled after" in line for line in engine.logs())


async def test_engine_leaving_early_cancels_in_the_worker(
    engine: WhisperEngine, speech: SpeechFiles
) -> None:
    """Leaving the `async with` mid-stream (client gone) sends Cancel; the worker stops early."""
    async with engine.transcribe(str(speech.long), request_id="gone") as t:
        async for _ in t:
            break
    assert engine.in_flight == 1  # the worker still holds the slot until it answers
    await engine.idle()
    assert t.done is not None and t.done.error_code == "cancelled"
    assert engine.in_flight == 0


async def test_engine_killed_worker_fails_in_flight_and_a_new_engine_works(
    whisper_model: str, speech: SpeechFiles
) -> None:
    """SIGKILL mid-transcription: EngineCrashed naming the signal; a fresh engine works."""
    crashed: list[WhisperEngine] = []
    doomed = _engine(whisper_model, "doomed", parallel=1)
    doomed.on_crash(crashed.append)
    await doomed.start()
    try:
        async with doomed.transcribe(str(speech.long), request_id="k") as t:
            with pytest.raises(EngineCrashed) as caught:
                async for _ in t:
                    assert doomed.pid is not None
                    os.kill(doomed.pid, signal.SIGKILL)
        assert "SIGKILL" in str(caught.value) and "'doomed'" in str(caught.value)
        assert crashed == [doomed] and doomed.failure is not None
        with pytest.raises(EngineCrashed):
            doomed.transcribe(str(speech.hello), request_id="after")
    finally:
        await doomed.stop()
    fresh = _engine(whisper_model, "fresh", parallel=1)
    await fresh.start()
    try:
        text, _ = await _text(fresh, str(speech.hello))
        assert has_words(text)
    finally:
        await fresh.stop()


async def test_engine_silent_worker_is_504_and_killed_as_a_crash(
    whisper_model: str, speech: SpeechFiles
) -> None:
    """SIGSTOP mid-transcription: after `silence_s` without a message the request ends
    EngineSilent (504 `engine_timeout`); the stuck worker was killed, and that exit is a
    crash (on_crash ran; `failure` names the silence; nothing new is accepted)."""
    crashed: list[WhisperEngine] = []
    stuck = WhisperEngine("stuck", whisper_model, parallel=1, cpu_threads=1, silence_s=3.0)
    stuck.on_crash(crashed.append)
    await stuck.start()
    try:
        async with stuck.transcribe(str(speech.long), request_id="s") as t:
            await t.wait_info()  # the worker decoded the file and is transcribing
            assert stuck.pid is not None
            os.kill(stuck.pid, signal.SIGSTOP)
            with pytest.raises(EngineSilent) as caught:
                async for _ in t:
                    pass
        error = caught.value
        assert (error.status, error.code) == (504, "engine_timeout")
        assert "'stuck'" in str(error) and "3 s" in str(error)
        assert crashed == [stuck] and stuck.failure is not None
        assert "stuck: nothing sent on a transcription for 3 s" in stuck.failure
        assert stuck.process is not None and stuck.process.exit is not None
        assert stuck.process.exit.returncode == -signal.SIGKILL
        assert stuck.in_flight == 0
        with pytest.raises(EngineCrashed):
            stuck.transcribe(str(speech.hello), request_id="after")
    finally:
        await stuck.stop()


async def test_engine_stop_returns_the_workers_memory(
    whisper_model: str, speech: SpeechFiles
) -> None:
    """Resident memory of this process tree after stop() is within 10% of before start()."""
    warm = _engine(whisper_model, "warm", parallel=1)  # runner-side imports and buffers
    await warm.start()
    await _text(warm, str(speech.hello))
    await warm.stop()
    before = tree_rss_bytes()
    e = _engine(whisper_model, "memory", parallel=1)
    await e.start()
    await _text(e, str(speech.hello))
    loaded = tree_rss_bytes()
    await e.stop()
    after = tree_rss_bytes()
    assert loaded - before > 50 * 1024 * 1024  # the worker really held the model
    assert abs(after - before) <= 0.10 * before, (before, loaded, after)
    assert e.state is EngineState.STOPPED
    with pytest.raises(EngineUnavailable):
        e.transcribe(str(speech.hello), request_id="x")


async def test_engine_missing_model_fails_start_with_the_workers_words() -> None:
    """A model path that does not exist: EngineStartFailed carrying the worker's last lines."""
    e = WhisperEngine("ghost", "/nonexistent/model-dir", load_timeout_s=60)
    with pytest.raises(EngineStartFailed) as caught:
        await e.start()
    assert "exited while starting" in str(caught.value)
    assert e.state is EngineState.FAILED
    await e.stop()

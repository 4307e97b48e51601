"""A transcription's silence bound, on `Transcription` alone (an engine stand-in that
records what it is asked): the bound is on the wait for each message, not on the whole."""

from __future__ import annotations

import asyncio

import pytest

from adapters.errors import EngineError, EngineSilent
from adapters.speech import Info, Segment
from adapters.whisper.messages import Done
from adapters.whisper.transcription import Transcription


class Owner:
    """The engine side: records cancels, forgets and silences."""

    def __init__(self, silence_s: float | None) -> None:
        self.silence_s = silence_s
        self.closed = False
        self.silenced: list[str] = []
        self.forgotten: list[str] = []

    def cancel(self, request_id: str) -> None:
        pass

    def forget(self, request_id: str) -> None:
        self.forgotten.append(request_id)

    async def silent(self, request_id: str) -> EngineError:
        self.silenced.append(request_id)
        return EngineSilent(f"{request_id} silent")


def _segment(i: int) -> Segment:
    return Segment("r", i, 0, float(i), float(i) + 1, f"word {i}", (1,), 0.0, -0.1, 1.0, 0.0)


async def test_transcription_messages_closer_than_the_bound_never_time_out() -> None:
    """25 segments 40 ms apart (1 s in all) under a 0.5 s bound: every one is read."""
    owner = Owner(silence_s=0.5)
    t = Transcription(owner, "r")

    async def worker() -> None:
        t.deliver(Info("r", 30.0, "en"))
        for i in range(25):
            await asyncio.sleep(0.04)
            t.deliver(_segment(i))
        t.deliver(Done("r", None, 1000))

    sending = asyncio.create_task(worker())
    segments = [s async for s in t]
    await sending
    assert len(segments) == 25 and owner.silenced == []


async def test_transcription_silence_ends_it_with_the_engines_error() -> None:
    """Info, then nothing for the bound: the engine is told (`silent`) and its error is
    raised; the request is forgotten (its slot is free)."""
    owner = Owner(silence_s=0.2)
    t = Transcription(owner, "r")
    t.deliver(Info("r", 30.0, "en"))
    with pytest.raises(EngineSilent, match="r silent"):
        async for _ in t:
            pass
    assert owner.silenced == ["r"] and owner.forgotten == ["r"]


async def test_transcription_closed_early_lets_go_when_the_worker_answers() -> None:
    """Closed mid-way (client gone): not settled until the worker's Done for the cancel
    comes, then `let_go` returns and the request is forgotten."""
    owner = Owner(silence_s=None)
    t = Transcription(owner, "r")
    t.deliver(Info("r", 30.0, "en"))
    await t.wait_info()
    await t.aclose()
    assert not t.settled and owner.forgotten == []
    waiting = asyncio.create_task(t.let_go())
    await asyncio.sleep(0)
    assert not waiting.done()
    t.deliver(Done("r", "cancelled", 10, "cancelled"))
    await asyncio.wait_for(waiting, 5)
    assert t.settled and owner.forgotten == ["r"] and owner.silenced == []


async def test_transcription_worker_silent_after_a_cancel_is_stuck() -> None:
    """Nothing from the worker for the bound after a cancel: it is stuck, the engine is
    told (`silent`, which kills it), and `let_go` returns."""
    owner = Owner(silence_s=0.05)
    t = Transcription(owner, "r")
    await t.aclose()
    await asyncio.wait_for(t.let_go(), 5)
    assert t.settled and owner.silenced == ["r"]

"""The question the engine watch asks (runner/engines/probes.py): any HTTP answer in time means
the engine is there, and `misses` unanswered in a row mean it is not; each kind names its own."""

from __future__ import annotations

import httpx
import pytest

from runner.engines.kinds import EngineKinds
from runner.engines.probes import HttpProber, MissedProbes

pytestmark = pytest.mark.timeout(10)


def test_missed_probes_gives_up_after_misses_in_a_row_once() -> None:
    """Three misses in a row give the engine up, on the third and only then; the count
    starts again after it."""
    tally: MissedProbes[str] = MissedProbes(3)
    assert [tally.observe("a", False) for _ in range(3)] == [False, False, True]
    assert tally.missed("a") == 0
    assert [tally.observe("a", False) for _ in range(3)] == [False, False, True]


def test_missed_probes_an_answer_resets_the_count() -> None:
    """Misses interrupted by an answer are not in a row: no give-up."""
    tally: MissedProbes[str] = MissedProbes(3)
    answers = [False, False, True, False, False, True, False, False]
    assert not any(tally.observe("a", answered) for answered in answers)
    assert tally.missed("a") == 2


def test_missed_probes_engines_counted_apart_and_forgotten_when_not_watched() -> None:
    """Each engine has its own count; one no longer watched loses it (a restarted engine
    starts from 0)."""
    tally: MissedProbes[int] = MissedProbes(2)
    assert not tally.observe(1, False)
    assert not tally.observe(2, False)
    tally.keep_only([2])
    assert tally.missed(1) == 0 and tally.missed(2) == 1
    assert not tally.observe(1, False)
    assert tally.observe(2, False)


def test_missed_probes_needs_at_least_one_miss() -> None:
    """A limit of 0 would give every engine up unasked: refused."""
    with pytest.raises(ValueError):
        MissedProbes(0)


def test_probes_each_kind_declares_its_own() -> None:
    """llama-server and vLLM are asked `/health`, ComfyUI `/system_stats`, a generic
    OpenAI engine `/v1/models`; a speech worker is not probed (its socket tells)."""
    probes = {kind.name: kind.traits.probe_path for kind in EngineKinds()}
    assert probes == {
        "llama-server": "/health",
        "vllm": "/health",
        "comfyui": "/system_stats",
        "openai": "/v1/models",
        "faster-whisper": None,
    }


@pytest.mark.parametrize("status", [200, 401, 503])
async def test_http_prober_any_answer_counts(status: int) -> None:
    """Whatever the status (a 503 while busy, a 401 behind a key), an answer is an answer."""
    prober = HttpProber(1.0, httpx.MockTransport(lambda _r: httpx.Response(status)))
    assert await prober.answers("http://engine/health")
    await prober.aclose()


async def test_http_prober_no_answer_in_time_is_a_miss() -> None:
    """A read timeout or a refused connection is a miss."""

    def silent(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("no answer", request=request)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    for handler in (silent, refused):
        prober = HttpProber(1.0, httpx.MockTransport(handler))
        assert not await prober.answers("http://engine/health")
        await prober.aclose()

"""The engine-kind interface's shared parts (adapters/kind.py): what a kind that declares
nothing special answers, and how a launched engine is closed."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from adapters.kind import CANNOT_SLEEP, Devices, EngineSettings, EngineSpec, KindDefaults
from adapters.launched import Launched
from faults import QuorumError, ServiceUnavailable

pytestmark = pytest.mark.timeout(10)


class Plain(KindDefaults):
    name = "plain"


class Host:
    families = None

    async def measure_mb(self, pid: int) -> int:
        return 0

    def gpu_total_mb(self, gpus: object) -> int | None:
        return None


async def test_kind_defaults_refuse_what_they_cannot_do() -> None:
    """A url beside a path is refused; a kind that neither starts nor attaches answers 503
    naming itself; nothing sleeps; its engines hold their own slots, unplaced files."""
    kind = Plain(EngineSettings())
    with pytest.raises(ValueError, match="url"):
        kind.check(EngineSpec("m", "plain", 1, url="http://h:1", path_text="/m"))
    spec = EngineSpec("m", "plain", 1)
    for call in (kind.start(spec, Devices(), Host()), kind.attach(spec, Host())):  # type: ignore[arg-type]
        with pytest.raises(ServiceUnavailable, match="'plain'"):
            await call
    assert kind.sleep_refusal(spec, on_gpu=True) == CANNOT_SLEEP
    assert kind.slot_group(spec) is None and kind.placed(spec)
    assert kind.model_file(Path("/models/m"), None) == Path("/models/m")


class Stopped:
    model_id = "m"
    slots = 1
    failure: str | None = None
    cut: QuorumError | None = None

    def __init__(self) -> None:
        self.stopped: list[float] = []

    def lost(self, reason: str) -> None:
        self.failure = reason

    async def stop(self, grace_s: float) -> None:
        self.stopped.append(grace_s)


async def test_launched_close_stops_the_engine_its_client_and_its_scratch(tmp_path: Path) -> None:
    """Closing a launched engine stops it with the grace given, closes its control client
    and removes its private folder; `lost` and `cut` reach the engine."""
    engine = Stopped()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    control = httpx.AsyncClient()
    launched = Launched(engine, None, control=control, scratch=str(scratch))
    launched.lost("exited: SIGKILL")
    launched.cut(ServiceUnavailable("unloading"))
    assert engine.failure == "exited: SIGKILL" and engine.cut is not None
    await launched.close(grace_s=2.5)
    assert engine.stopped == [2.5] and control.is_closed and not scratch.exists()

"""vLLM's model-class inspection kept between the engine's starts (`VLLM_MODEL_INFO_DIR`,
adapters/vllm/kind.py `keep_model_info`): the fake `vllm` started as the runner starts it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from adapters.kind import Devices, EngineSettings, EngineSpec
from adapters.vllm.kind import VllmKind
from tests.fixtures.fake_vllm import BIN, process_env

pytestmark = pytest.mark.timeout(60)


class Host:
    families = None

    async def measure_mb(self, pid: int) -> int:
        return 0

    def gpu_total_mb(self, gpus: object) -> int | None:
        return None


async def _start_and_stop(settings: EngineSettings) -> tuple[Path, str]:
    """Start the fake `vllm` as the kind does; what its cache's `modelinfos` is while it
    runs (the link's target, or "" when there is none); then stop it."""
    kind = VllmKind(settings)
    launched = await kind.start(
        EngineSpec("m", "vllm", 1, hf="org/m", load_timeout_s=30),
        Devices(env=process_env()),
        Host(),  # type: ignore[arg-type]
    )
    assert launched.scratch is not None
    infos = Path(launched.scratch) / "cache" / "modelinfos"
    target = os.readlink(infos) if infos.is_symlink() else ""
    await launched.close(grace_s=5)
    assert not Path(launched.scratch).exists()
    return infos, target


async def test_vllm_model_info_folder_outlives_each_start(tmp_path: Path) -> None:
    """With `VLLM_MODEL_INFO_DIR` each start's `$VLLM_CACHE_ROOT/modelinfos` is that folder
    (made, private, when missing), and what vLLM wrote there outlives the engine; without
    it the engine's cache has none of its own to begin with."""
    folder = tmp_path / "model-info"
    settings = EngineSettings(environ={"VLLM_BIN": str(BIN), "VLLM_MODEL_INFO_DIR": str(folder)})
    _, target = await _start_and_stop(settings)
    assert target == str(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    (folder / "kept.json").write_text("{}")  # as vLLM writes its inspection
    _, again = await _start_and_stop(settings)
    assert again == str(folder) and (folder / "kept.json").exists()
    _, none = await _start_and_stop(EngineSettings(environ={"VLLM_BIN": str(BIN)}))
    assert none == ""

"""A bad `IMAGES_DIR` stops the start with exit 2 and one line naming it (issue 41), as
every other start-up refusal does (docs/configuration.md), never a Python traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.launch import REPO_ROOT

pytestmark = pytest.mark.timeout(60)


def _serve(tmp_path: Path, images_dir: Path) -> subprocess.CompletedProcess[str]:
    """`quorum serve` with one ComfyUI model (attached: nothing is reached before the app
    is built), so it keeps an image store in `images_dir`."""
    models = tmp_path / "models.yaml"
    models.write_text(
        "models:\n  - {id: sd, backend: comfyui, url: 'http://127.0.0.1:9', "
        "workflow: model-free-test}\n"
    )
    env = {**os.environ, "MODELS_CONFIG": str(models), "IMAGES_DIR": str(images_dir)}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["PORT"] = "0"
    command = [sys.executable, "-m", "runner.runtime.cli", "serve"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=50)


@pytest.mark.parametrize("kind", ["a-file", "foreign-files"])
def test_serve_with_a_bad_images_dir_exits_2_with_one_line(tmp_path: Path, kind: str) -> None:
    """IMAGES_DIR a file, or a folder holding files not the runner's: `quorum serve` exits 2
    with one `quorum: ...` line naming the folder, and no traceback."""
    images_dir = tmp_path / "images"
    if kind == "a-file":
        images_dir.write_text("not a folder")
    else:
        images_dir.mkdir()
        (images_dir / "holiday.jpg").write_bytes(b"x")
    done = _serve(tmp_path, images_dir)
    err = done.stderr
    assert done.returncode == 2, err
    lines = [line for line in err.splitlines() if line.startswith("quorum: ")]
    assert len(lines) == 1, err
    assert str(images_dir) in lines[0]
    assert "Traceback" not in err
    assert images_dir.exists() and (kind == "a-file") == images_dir.is_file()

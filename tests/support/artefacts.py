"""Files tests keep for people to look at (screenshots): under QUORUM_ARTEFACTS, else
`test-artefacts/` at the repository root (ignored by git). The session's summary lists
every file kept (tests/conftest.py), so CI logs show where they are."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.runner_proc import REPO_ROOT

KEPT: list[Path] = []


def artefact(name: str) -> Path:
    """Where to write the artefact `name` (its folder exists); listed at the session's end."""
    root = Path(os.environ.get("QUORUM_ARTEFACTS") or REPO_ROOT / "test-artefacts")
    root.mkdir(parents=True, exist_ok=True)
    path = root / name
    KEPT.append(path)
    return path

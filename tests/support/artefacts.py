"""Files tests keep for people to look at (screenshots): under QUORUM_ARTEFACTS, else
`test-artefacts/` at the repository root (ignored by git). The session's summary lists
every file written there during the session (tests/conftest.py), by this process or by
pytest-xdist's workers, so CI logs show where they are."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.runner_proc import REPO_ROOT


def _root() -> Path:
    return Path(os.environ.get("QUORUM_ARTEFACTS") or REPO_ROOT / "test-artefacts")


def artefact(name: str) -> Path:
    """Where to write the artefact `name` (its folder exists); listed at the session's end."""
    root = _root()
    root.mkdir(parents=True, exist_ok=True)
    return root / name


def kept_since(started: float) -> list[Path]:
    """The artefacts written at or after `started` (a time.time())."""
    root = _root()
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*") if p.is_file() and p.stat().st_mtime >= started)

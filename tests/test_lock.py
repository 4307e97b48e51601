"""The locks scripts/install and the Dockerfile install from (requirements/, scripts/upgrade)
against pyproject.toml's ranges: every requirement of the set a lock is for is pinned there,
at a version the range allows, with its hashes, and uvicorn at a version the HTTP seam was
tested with (runner/http/uvicorn_seam.py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from runner.http.uvicorn_seam import TESTED_UVICORN
from tests.support.runner_proc import REPO_ROOT

LOCKS = {"dev": "lock-dev.txt", "": "lock.txt", "gpu": "lock-gpu.txt"}
"""QUORUM_EXTRAS (scripts/install) -> its lock in requirements/."""

IMAGE = {
    **default_environment(),
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "python_version": "3.11",
    "python_full_version": "3.11.9",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
"""The environment the markers are read in: the image's (python:3.11 on Linux x86_64)."""


def _pins(lock: Path) -> dict[str, tuple[Version, int]]:
    """name -> (pinned version, number of hashes), of the entries that apply in IMAGE."""
    text = lock.read_text().replace("\\\n", " ")
    pins: dict[str, tuple[Version, int]] = {}
    for line in text.splitlines():
        if not line or line[0] in "# ":
            continue
        hashes = len(re.findall(r"--hash=sha256:[0-9a-f]{64}", line))
        req = Requirement(line.split(" --hash")[0].strip())
        if req.marker is not None and not req.marker.evaluate(IMAGE):
            continue
        (spec,) = req.specifier
        assert spec.operator == "==", line
        pins[canonicalize_name(req.name)] = (Version(spec.version), hashes)
    return pins


def _required(extras: str) -> list[Requirement]:
    """pyproject.toml's build requirements, dependencies and the `extras` set's."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    lines = [*pyproject["build-system"]["requires"], *project["dependencies"]]
    for extra in filter(None, extras.split(",")):
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


@pytest.mark.parametrize("extras", list(LOCKS))
def test_lock_pins_every_requirement_of_pyproject_within_its_range(extras: str) -> None:
    """Each requirement of pyproject.toml (build, base, the extras of this lock) that applies
    on the image is pinned in the lock at a version its range allows."""
    pins = _pins(REPO_ROOT / "requirements" / LOCKS[extras])
    wrong = []
    for req in _required(extras):
        if req.marker is not None and not req.marker.evaluate(IMAGE):
            continue
        pinned = pins.get(canonicalize_name(req.name))
        if pinned is None or not req.specifier.contains(pinned[0], prereleases=True):
            wrong.append(f"{req} -> {pinned[0] if pinned else 'not in the lock'}")
    assert not wrong, f"requirements/{LOCKS[extras]}: {wrong}; run scripts/upgrade --keep"


@pytest.mark.parametrize("extras", list(LOCKS))
def test_lock_every_pin_has_a_hash(extras: str) -> None:
    """pip's --require-hashes refuses a lock with an entry without hashes: none is."""
    pins = _pins(REPO_ROOT / "requirements" / LOCKS[extras])
    assert pins
    assert [name for name, (_, hashes) in pins.items() if hashes == 0] == []


@pytest.mark.parametrize("extras", list(LOCKS))
def test_lock_uvicorn_is_a_version_the_seam_was_tested_with(extras: str) -> None:
    """Every lock installs a uvicorn that runner/http/uvicorn_seam.py lets start."""
    version, _ = _pins(REPO_ROOT / "requirements" / LOCKS[extras])["uvicorn"]
    assert str(version) in TESTED_UVICORN


def test_lock_one_for_each_extras_set_scripts_install_and_the_dockerfile_use() -> None:
    """scripts/install names its lock from QUORUM_EXTRAS; the Dockerfile's default ("") and
    the GPU image's ("gpu") and CI's ("dev") each have theirs, and nothing else is there."""
    script = (REPO_ROOT / "scripts" / "install").read_text()
    assert 'lock="requirements/lock${extras:+-$extras}.txt"' in script
    assert "--require-hashes" in script
    assert 'extras="${QUORUM_EXTRAS-dev}"' in script
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert 'ARG QUORUM_EXTRAS=""' in dockerfile and "QUORUM_EXTRAS=gpu" in dockerfile
    present = {p.name for p in (REPO_ROOT / "requirements").glob("lock*.txt")}
    assert present == set(LOCKS.values())

"""The image store behind `response_format: url`: unguessable tokens that expire, in a
folder that is provably the runner's own, emptied on a graceful stop and, after a SIGKILL,
at the next start (issue 29)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from adapters.image_store import MARKER, TOKEN_RE, ImageStore, file_path
from faults import ConfigError
from tests.fixtures.launch import REPO_ROOT

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _images(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != MARKER)


def test_store_keeps_an_image_until_it_expires(tmp_path: Path) -> None:
    """An image is readable by its token for `ttl_s`, then gone (file removed too)."""
    clock = Clock()
    store = ImageStore(tmp_path, ttl_s=60, clock=clock)
    token = store.put(b"\x89PNG data")
    assert TOKEN_RE.fullmatch(token)
    assert file_path(token) == f"/v1/images/files/{token}.png"
    clock.now += 59
    assert store.get(token) == b"\x89PNG data"
    clock.now += 1
    assert store.get(token) is None
    assert _images(tmp_path) == []


def test_store_refuses_malformed_and_unknown_tokens(tmp_path: Path) -> None:
    """A token that is not one of ours never touches the file system."""
    store = ImageStore(tmp_path)
    store.put(b"x")
    assert store.get("../../etc/passwd") is None
    assert store.get("A" * 32) is None


def test_store_sweep_removes_expired_and_left_over_images_only(tmp_path: Path) -> None:
    """Sweep drops expired images and image files no token points to; a file the store did
    not name (someone else's, in the runner's folder) is never touched."""
    clock = Clock()
    store = ImageStore(tmp_path, ttl_s=10, clock=clock)
    keep = store.put(b"keep")
    clock.now += 5
    old = store.put(b"old")
    (tmp_path / f"{'B' * 32}.png").write_bytes(b"no token points here")
    (tmp_path / "notes.txt").write_bytes(b"not ours")
    clock.now += 6  # `keep` expired, `old` not
    assert store.sweep() == 1  # the image no token points to
    assert store.get(keep) is None and store.get(old) == b"old"
    assert _images(tmp_path) == sorted([f"{old}.png", "notes.txt"])


def test_store_close_removes_every_image_and_its_marker(tmp_path: Path) -> None:
    """A graceful stop: every image and the marker go; a folder the operator gave stays,
    with whatever else is in it; a temporary folder the store made goes entirely."""
    given = tmp_path / "images"
    store = ImageStore(given)
    store.put(b"a")
    store.put(b"b")
    assert store.close() == 2
    assert list(given.iterdir()) == []
    temporary = ImageStore.temporary(parent=str(tmp_path))
    temporary.put(b"c")
    folder = temporary.directory
    assert folder.parent == tmp_path and (folder / MARKER).is_file()
    temporary.close()
    assert not folder.exists()
    assert store.close() == 0  # idempotent


def test_store_refuses_a_folder_that_is_not_the_runners(tmp_path: Path) -> None:
    """A folder holding somebody else's files (and no marker), or one another live store
    holds: refused with a clear error, nothing in it touched."""
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "holiday.png").write_bytes(b"x")
    with pytest.raises(ConfigError, match="not the runner's images"):
        ImageStore(tmp_path / "theirs")
    assert _images(tmp_path / "theirs") == ["holiday.png"]
    first = ImageStore(tmp_path / "mine")
    with pytest.raises(ConfigError, match="in use by another running runner"):
        ImageStore(tmp_path / "mine")
    first.close()
    ImageStore(tmp_path / "mine").close()  # free again once closed


HOLDER = """
import sys, time
from adapters.image_store import ImageStore
store = ImageStore.temporary(parent=sys.argv[1]) if sys.argv[2] == "temp" else ImageStore(
    __import__("pathlib").Path(sys.argv[1]))
store.put(b"an image answered by URL")
print(store.directory, flush=True)
time.sleep(600)
"""


@contextmanager
def _holder(where: Path, mode: str) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A process holding an image store with one image in it; killed at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(where), mode],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield proc, Path(proc.stdout.readline().strip())
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_store_after_sigkill_the_next_start_removes_the_images(tmp_path: Path) -> None:
    """A runner killed with SIGKILL leaves its folder; the next start (the default:
    `temporary`) removes the folders of dead runners, and only those: a live runner's,
    an unmarked `quorum-images-*` folder and anything not the store's stay."""
    unmarked = tmp_path / "quorum-images-unmarked"
    unmarked.mkdir()
    (unmarked / f"{'C' * 32}.png").write_bytes(b"not provably ours")
    with (
        _holder(tmp_path, "temp") as (dead, dead_folder),
        _holder(tmp_path, "temp") as (
            _,
            live_folder,
        ),
    ):
        (dead_folder / "theirs.txt").write_bytes(b"somebody else's")
        dead.send_signal(signal.SIGKILL)
        dead.wait(10)
        assert len(_images(dead_folder)) == 2  # the image and theirs.txt: nothing cleaned
        store = ImageStore.temporary(parent=str(tmp_path))
        assert _images(dead_folder) == ["theirs.txt"] and not (dead_folder / MARKER).exists()
        assert len(_images(live_folder)) == 1 and (live_folder / MARKER).is_file()
        assert _images(unmarked) == [f"{'C' * 32}.png"]
        store.close()


def test_store_images_dir_after_sigkill_is_emptied_by_the_next_start(tmp_path: Path) -> None:
    """IMAGES_DIR: a killed runner's images are removed when the next one takes the folder
    (its lock died with the process)."""
    folder = tmp_path / "images"
    with _holder(folder, "dir") as (dead, _):
        dead.send_signal(signal.SIGKILL)
        dead.wait(10)
    assert len(_images(folder)) == 1
    store = ImageStore(folder)
    assert _images(folder) == []
    store.close()

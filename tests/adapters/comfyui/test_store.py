"""The image store behind `response_format: url`: unguessable tokens that expire."""

from __future__ import annotations

from pathlib import Path

from adapters.comfyui.store import TOKEN_RE, ImageStore, file_path


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


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
    assert list(tmp_path.iterdir()) == []


def test_store_refuses_malformed_and_unknown_tokens(tmp_path: Path) -> None:
    """A token that is not one of ours never touches the file system."""
    store = ImageStore(tmp_path)
    store.put(b"x")
    assert store.get("../../etc/passwd") is None
    assert store.get("A" * 32) is None


def test_store_sweep_removes_expired_and_orphaned_files(tmp_path: Path) -> None:
    """Sweep drops expired images and files left by an earlier process."""
    (tmp_path / "left-over.png").write_bytes(b"old")
    clock = Clock()
    store = ImageStore(tmp_path, ttl_s=10, clock=clock)
    keep = store.put(b"keep")
    clock.now += 5
    old = store.put(b"old")
    clock.now += 6  # `keep` expired, `old` not
    assert store.sweep() == 1  # the left-over file
    assert store.get(keep) is None and store.get(old) == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{old}.png"]

"""Generated images kept for `response_format: url`, under unguessable names, for a while.

OpenAI's image URLs expire (after an hour); these do too. A URL is a capability: whoever
holds it can read the image, as with OpenAI's. The runner serves them at
`GET /v1/images/files/{token}.png` (`runner/http/images/handler.ImageFiles`). Which token
expires when is kept in memory, so a URL lives no longer than the runner that answered
it; `keep` removes its file when the TTL has passed, and `sweep` (now and then) what is
left over.

The folder is the runner's own, provably, and nothing else in it or beside it is touched:

- it holds a marker file (`.quorum-images`) that the store keeps locked (`flock`) while it
  is open; a folder whose marker is locked is another live runner's (refused), one
  holding anything but the runner's files and no marker is somebody else's (refused);
- only files named as the store names them (`<token>.png`, `<token>.png.tmp`) are removed;
- `close()` (a graceful stop) removes every image and the marker, and the folder itself
  when the store made it (`temporary`);
- after a SIGKILL the lock died with the process: the next start takes the folder
  (IMAGES_DIR: the same folder; the default: every `quorum-images-*` folder of this user
  under the temporary folder whose marker nobody holds, `reclaim`) and removes its images.

File I/O here is blocking except in `keep`: callers run it in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import re
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from faults import ConfigError

log = logging.getLogger("quorum.comfyui")

FILES_PATH = "/v1/images/files/"
TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{32}")
FILE_RE = re.compile(r"[A-Za-z0-9_-]{32}\.png(\.tmp)?")
"""The names of the files the store writes: the only files it ever removes."""
MARKER = ".quorum-images"
TEMP_PREFIX = "quorum-images-"


@dataclass(frozen=True, slots=True)
class Stored:
    path: Path
    expires_at: float


class ImageStore:
    def __init__(
        self,
        directory: Path,
        ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
        *,
        made_here: bool = False,
    ) -> None:
        """Take `directory` (created when missing) as this store's; `made_here`: the store
        made it, so `close` removes it too. ConfigError when it is not the runner's to take
        (another live runner's, or somebody else's files in it)."""
        self.directory = directory
        self.ttl_s = ttl_s
        self._clock = clock
        self._items: dict[str, Stored] = {}
        self._made_here = made_here
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._lock: int | None = _claim(directory)
            left = _remove_images(directory, keep=set())
        except OSError as exc:  # not a folder, not writable, ...: the setting's fault
            raise ConfigError(
                f"image folder {directory} cannot be used: {exc.strerror or exc} "
                "(IMAGES_DIR must be a folder the runner may write)"
            ) from None
        if left:
            log.info("image store %s: %d image(s) of an earlier run removed", directory, left)

    @classmethod
    def temporary(cls, ttl_s: float = 3600.0, parent: str | None = None) -> ImageStore:
        """A new folder of its own under the temporary folder (`parent`, else the system's),
        after reclaiming those of runners that died without closing theirs."""
        reclaim(Path(parent or tempfile.gettempdir()))
        directory = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=parent))
        return cls(directory, ttl_s, made_here=True)

    def put(self, data: bytes, suffix: str = ".png") -> str:
        """Keep `data`; its token (32 URL-safe characters, 192 random bits)."""
        token = secrets.token_urlsafe(24)
        path = self.directory / f"{token}{suffix}"
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        self._items[token] = Stored(path, self._clock() + self.ttl_s)
        return token

    async def keep(self, data: bytes, suffix: str = ".png") -> str:
        """`put` in a thread, and the file removed `ttl_s` seconds later (on this loop)."""
        token = await asyncio.to_thread(self.put, data, suffix)
        loop = asyncio.get_running_loop()
        loop.call_later(self.ttl_s, lambda: loop.run_in_executor(None, self._expire, token))
        return token

    def _expire(self, token: str) -> None:
        try:
            self._drop(token)
        except OSError as exc:
            log.warning("image store: could not remove an expired image: %s", exc)

    def get(self, token: str) -> bytes | None:
        """The image, or None when the token is unknown, malformed or expired."""
        if not TOKEN_RE.fullmatch(token):
            return None
        item = self._items.get(token)
        if item is None:
            return None
        if self._clock() >= item.expires_at:
            self._drop(token)
            return None
        try:
            return item.path.read_bytes()
        except FileNotFoundError:
            self._items.pop(token, None)
            return None

    def sweep(self) -> int:
        """Remove expired images and image files no token points to; how many files went."""
        now = self._clock()
        for token in [t for t, s in self._items.items() if now >= s.expires_at]:
            self._drop(token)
        known = {s.path.name for s in self._items.values()}
        return _remove_images(self.directory, keep=known)

    def close(self) -> int:
        """A graceful stop: every image removed, then the marker (the lock let go), then the
        folder when the store made it; how many images went. Idempotent."""
        self._items.clear()
        removed = _remove_images(self.directory, keep=set())
        if self._lock is not None:
            _release(self.directory, self._lock)
            self._lock = None
            if self._made_here:
                with contextlib.suppress(OSError):  # not empty: somebody put files there
                    self.directory.rmdir()
        return removed

    def _drop(self, token: str) -> None:
        item = self._items.pop(token, None)
        if item is not None:
            with contextlib.suppress(FileNotFoundError):
                item.path.unlink()


def _claim(directory: Path) -> int:
    """Lock `directory`'s marker (made locked: a temporary name, locked, then renamed, so
    no one sees it unlocked); the open descriptor holds the lock."""
    marker = directory / MARKER
    try:
        fd = os.open(marker, os.O_RDWR)
    except FileNotFoundError:
        strangers = [
            p.name
            for p in directory.iterdir()
            if not FILE_RE.fullmatch(p.name) and not p.name.startswith(f"{MARKER}.")
        ]
        if strangers:
            raise ConfigError(
                f"image folder {directory} holds files that are not the runner's images "
                f"(e.g. {sorted(strangers)[0]!r}): give IMAGES_DIR a folder of its own"
            ) from None
        fresh = directory / f"{MARKER}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(fresh, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.replace(fresh, marker)
    else:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                f"image folder {directory} is in use by another running runner: give each "
                "runner its own IMAGES_DIR"
            ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"quorum image store, pid {os.getpid()}\n".encode())
    return fd


def _release(directory: Path, fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        (directory / MARKER).unlink()
    os.close(fd)


def _remove_images(directory: Path, keep: set[str]) -> int:
    """Remove the store's files in `directory` but those named in `keep`; how many went."""
    removed = 0
    for path in directory.iterdir():
        if FILE_RE.fullmatch(path.name) and path.name not in keep and path.is_file():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
    return removed


def reclaim(parent: Path) -> int:
    """Remove the image folders runners left under `parent` when they were killed: each
    `quorum-images-*` folder of this user with a marker no live process holds locked
    (only its images and marker go; the folder too once empty); how many folders went."""
    gone = 0
    for folder in parent.glob(f"{TEMP_PREFIX}*"):
        try:
            if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
            fd = os.open(folder / MARKER, os.O_RDWR)
        except OSError:  # no marker: not provably a runner's folder
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live runner's
            os.close(fd)
            continue
        removed = _remove_images(folder, keep=set())
        _release(folder, fd)
        with contextlib.suppress(OSError):
            folder.rmdir()
            gone += 1
        log.info("image folder %s of a killed runner: %d image(s) removed", folder, removed)
    return gone


def file_path(token: str) -> str:
    """The runner path that serves the image with this token."""
    return f"{FILES_PATH}{token}.png"

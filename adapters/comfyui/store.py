"""Generated images kept for `response_format: url`, under unguessable names, for a while.

OpenAI's image URLs expire (after an hour); these do too. A URL is a capability: whoever
holds it can read the image, as with OpenAI's. The runner serves them at
`GET /v1/images/files/{token}.png` (`runner/images/handler.ImageFiles`). Files live in one
directory; which token expires when is kept in memory, so a restart forgets them and `sweep`
(called at start-up and now and then) removes files nobody can reach any more. `keep`
also removes its file when the TTL has passed, so an image is not on disk longer than it
can be fetched. File I/O here is blocking except in `keep`: callers run it in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("quorum.comfyui")

FILES_PATH = "/v1/images/files/"
TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{32}")


@dataclass(frozen=True, slots=True)
class Stored:
    path: Path
    expires_at: float


class ImageStore:
    def __init__(
        self, directory: Path, ttl_s: float = 3600.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.directory = directory
        self.ttl_s = ttl_s
        self._clock = clock
        self._items: dict[str, Stored] = {}
        directory.mkdir(parents=True, exist_ok=True)

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
        """Remove expired images and files no token points to; how many files went."""
        now = self._clock()
        for token in [t for t, s in self._items.items() if now >= s.expires_at]:
            self._drop(token)
        known = {s.path.name for s in self._items.values()}
        removed = 0
        for path in self.directory.iterdir():
            if path.is_file() and path.name not in known:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed += 1
        return removed

    def _drop(self, token: str) -> None:
        item = self._items.pop(token, None)
        if item is not None:
            with contextlib.suppress(FileNotFoundError):
                item.path.unlink()


def file_path(token: str) -> str:
    """The runner path that serves the image with this token."""
    return f"{FILES_PATH}{token}.png"

"""One model's saved prompt states on disk: warm prefixes that outlive its engine.

The folder is the engine's `--slot-save-path`; llama-server writes a slot's state there
(`POST /slots/{id}?action=save {"filename"}`: the slot's tokens and KV cache) and reads it
back (`action=restore`). Beside each state file the runner writes what the state holds:

    <root>/<key>/                        0700, one per model file x engine build x flags
        q-<16 hex>.bin                   0600, a tenant's saved slot (llama-server's file)
        q-<16 hex>.json                  0600, {tenant, tag, adapter, prefix, saved_at}
        p-<16 hex>.bin / .json           the same for a public prefix (tenant "")

`<key>` (`folder_key`) is a digest of the model file's sha256, the engine binary's sha256
and the flags that shape the KV cache, so a different model, build or cache layout never
restores a state it did not write. A tenant's states are tenant data at rest: the prompt
start is in the `.json`, the prompt's tokens and KV in the `.bin`; both readable by the
runner's user only, kept until the least recently used go past `max_bytes` or
`max_entries`, until unused for `ttl_s`, or until a flush of the tenant, its tag, the model
or everything (`docs/engines.md`, "What is on disk").

The index lives in memory, read back from the `.json` files when the store opens (a
runner restart, a reload); a `.bin` without its `.json` (a crash between the two writes),
a `.json` without its `.bin`, and unreadable ones are removed then. Used only from the
event loop; each call is a few small file operations.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from adapters.llama_server.slots import SavedView

log = logging.getLogger("quorum.llama_server")

STATE = ".bin"
META = ".json"


def folder_key(model_sha256: str, binary_sha256: str, flags: Sequence[str]) -> str:
    """The folder a model's states go in: its file, the engine build and the KV-shaping
    flags (pure)."""
    text = "\n".join([model_sha256, binary_sha256, *flags])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Bounds:
    max_bytes: int
    max_entries: int
    ttl_s: float


class PrefixStore:
    """The saved states of one model (one folder); `persistent=False`: a private folder
    removed with the engine (PREFIX_CACHE_DIR unset)."""

    def __init__(
        self,
        folder: Path,
        bounds: Bounds,
        *,
        persistent: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.folder = folder
        self.bounds = bounds
        self.persistent = persistent
        self.clock = clock
        self._entries: dict[str, SavedView] = {}
        self._used: dict[str, float] = {}  # key -> last used (saved or restored)

    # -- reading -----------------------------------------------------------------------

    def open(self) -> None:
        """Create the folder (0700) and read the index back from it; drop what is
        incomplete, unreadable or expired; apply the bounds."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        self._entries.clear()
        self._used.clear()
        names = {p.name for p in self.folder.iterdir()}
        for name in sorted(names):
            stem, ext = os.path.splitext(name)
            if ext == STATE:
                meta = stem + META
                view = _read_meta(self.folder / meta, name) if meta in names else None
                if view is None:  # no description (or an unreadable one): unusable
                    self._unlink(name)
                    self._unlink(meta)
                    continue
                stat = (self.folder / name).stat()
                self._entries[name] = replace(view, size=stat.st_size)
                self._used[name] = stat.st_mtime
            elif ext == ".tmp" or (ext == META and stem + STATE not in names):
                self._unlink(name)
        self.enforce()

    @property
    def entries(self) -> list[SavedView]:
        return list(self._entries.values())

    def get(self, key: str) -> SavedView | None:
        return self._entries.get(key)

    @property
    def bytes_used(self) -> int:
        return sum(v.size for v in self._entries.values())

    # -- writing -----------------------------------------------------------------------

    def new_key(self, public: bool = False) -> str:
        """A fresh file name for a state the engine is about to save."""
        return f"{'p' if public else 'q'}-{secrets.token_hex(8)}{STATE}"

    def add(self, view: SavedView) -> list[str]:
        """The engine saved `view.key`: make it the runner's only (0600), write its
        description, and apply the bounds; the keys that had to go."""
        path = self.folder / view.key
        try:
            os.chmod(path, 0o600)
            size = path.stat().st_size
        except OSError as exc:
            log.warning("saved state %s is not there: %s", view.key, exc)
            return []
        view = replace(view, size=size)
        meta = self.folder / (view.key.removesuffix(STATE) + META)
        tmp = meta.with_suffix(".tmp")
        data = {k: v for k, v in asdict(view).items() if k not in ("key", "size")}
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, meta)
        self._entries[view.key] = view
        self._used[view.key] = now = self.clock()
        with contextlib.suppress(OSError):
            os.utime(path, (now, now))  # its last use, read back when the store opens
        return self.enforce()

    def touch(self, key: str) -> None:
        """`key` was restored: it is the most recently used (kept on disk as its mtime)."""
        if key in self._entries:
            now = self.clock()
            self._used[key] = now
            with contextlib.suppress(OSError):
                os.utime(self.folder / key, (now, now))

    def remove(self, key: str) -> None:
        self._entries.pop(key, None)
        self._used.pop(key, None)
        self._unlink(key)
        self._unlink(key.removesuffix(STATE) + META)

    def remove_where(self, matches: Callable[[SavedView], bool]) -> int:
        """Remove every entry `matches` says; how many."""
        gone = [k for k, v in self._entries.items() if matches(v)]
        for key in gone:
            self.remove(key)
        return len(gone)

    def enforce(self) -> list[str]:
        """Expired entries go; then the least recently used until within both bounds."""
        now = self.clock()
        gone = [k for k, used in self._used.items() if now - used > self.bounds.ttl_s]
        for key in gone:
            self.remove(key)
        order = sorted(self._entries, key=lambda k: self._used.get(k, 0.0))
        size = self.bytes_used
        while order and (
            size > self.bounds.max_bytes or len(self._entries) > self.bounds.max_entries
        ):
            key = order.pop(0)
            size -= self._entries[key].size
            self.remove(key)
            gone.append(key)
        return gone

    def close(self) -> None:
        """A private folder goes with its engine; a persistent one stays."""
        if not self.persistent:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _unlink(self, name: str) -> None:
        with contextlib.suppress(OSError):
            os.remove(self.folder / name)


def _read_meta(path: Path, key: str) -> SavedView | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return SavedView(
            key=key,
            tenant=str(data["tenant"]),
            tag=data["tag"] if isinstance(data.get("tag"), str) else None,
            prefix=str(data["prefix"]),
            saved_at=float(data["saved_at"]),
            adapter=str(data.get("adapter", "")),
            public=str(data.get("public", "")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def sweep(
    root: Path,
    bounds: Bounds,
    matches: Callable[[SavedView], bool] | None = None,
    skip: Iterable[Path] = (),
    clock: Callable[[], float] = time.time,
) -> int:
    """Every model folder under `root` but `skip` (those an engine holds open): expired
    entries removed and, with `matches`, the entries it says (a flush of a tenant or a
    tag reaches the states of models not loaded too); empty folders removed. How many
    entries `matches` removed."""
    if not root.is_dir():
        return 0
    held = {p.resolve() for p in skip}
    removed = 0
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if folder.resolve() in held:
            continue
        store = PrefixStore(folder, bounds, clock=clock)
        store.open()
        if matches is not None:
            removed += store.remove_where(matches)
        if not any(folder.iterdir()):
            with contextlib.suppress(OSError):
                folder.rmdir()
    return removed


class PrefixCache:
    """Every model's prefix cache folder under one root (PREFIX_CACHE_DIR), and the file
    digests the folders are keyed by (kept in `<root>/digests.json`, so a model file is
    read through once, not at every load: keyed by its path, inode, size and mtime).

    `root` None: nothing outlives an engine; each gets a private folder, removed with it.
    """

    def __init__(
        self, root: Path | None, bounds: Bounds, clock: Callable[[], float] = time.time
    ) -> None:
        self.root = root
        self.bounds = bounds
        self.clock = clock
        self._digests: dict[str, tuple[int, int, int, int, str]] | None = None

    def store_for(
        self, model: Path, binary: Path, flags: Sequence[str], scratch: Path
    ) -> PrefixStore:
        """The opened store of a model file served by `binary` with `flags` (blocking:
        reads and may hash the files; call it in a thread)."""
        if self.root is not None:
            try:
                key = folder_key(self.digest(model), self.digest(binary), flags)
                store = PrefixStore(self.root / key, self.bounds, clock=self.clock)
                store.open()
                return store
            except OSError as exc:  # serve without warm prefixes rather than not at all
                log.error(
                    "PREFIX_CACHE_DIR %s is not usable (%s): this engine's saved prefixes "
                    "go with it",
                    self.root,
                    exc.strerror or exc,
                )
        store = PrefixStore(scratch / "slots", self.bounds, persistent=False, clock=self.clock)
        store.open()
        return store

    def digest(self, path: Path) -> str:
        """`path`'s sha256, computed once per version of the file."""
        stat = path.stat()
        ident = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        digests = self._load_digests()
        name = str(path.resolve())
        known = digests.get(name)
        if known is not None and tuple(known[:4]) == ident:
            return known[4]
        sha = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                sha.update(chunk)
        digests[name] = (*ident, sha.hexdigest())
        self._save_digests(digests)
        return sha.hexdigest()

    def sweep(self, matches: Callable[[SavedView], bool] | None, skip: Iterable[Path]) -> int:
        """`sweep` over this root (nothing without one)."""
        if self.root is None:
            return 0
        return sweep(self.root, self.bounds, matches, skip, self.clock)

    def _load_digests(self) -> dict[str, tuple[int, int, int, int, str]]:
        if self._digests is None:
            self._digests = {}
            if self.root is not None:
                with contextlib.suppress(OSError, ValueError, TypeError):
                    raw = json.loads((self.root / "digests.json").read_text())
                    self._digests = {k: tuple(v) for k, v in raw.items() if len(v) == 5}
        return self._digests

    def _save_digests(self, digests: dict[str, tuple[int, int, int, int, str]]) -> None:
        if self.root is None:
            return
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.root / "digests.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(digests, f)
        os.replace(tmp, self.root / "digests.json")

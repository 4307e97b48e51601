"""Hugging Face downloads into HF_HOME, with the bytes done so far for the load task.

huggingface_hub reports a snapshot's progress only through a tqdm class it is given
(`snapshot_download(tqdm_class=...)`, read in huggingface_hub 2.x `_snapshot_download.py`):
it makes byte bars (`unit="B"`) whose `total` grows by each file's size as the file
starts and whose `update(n)` counts the bytes written, from the download's worker threads.
`ByteMeter.bar_class()` is such a class, drawing nothing; each update calls the meter's
`on_bytes` (from the download's thread), and the load task reads `ByteMeter.fraction()`
then (`fetch_reporting`, for `runner/lifecycle/loads.py`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tqdm.std import tqdm


class _Discard:
    """A file that drops what the bars would draw."""

    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass


_DISCARD = _Discard()


class ByteMeter:
    """Bytes done and expected of one download, fed by its threads, read by the task."""

    def __init__(self, on_bytes: Callable[[], None] = lambda: None) -> None:
        self._lock = threading.Lock()
        self._bars: dict[int, tuple[float, float]] = {}  # bar id -> (n, total)
        self.on_bytes = on_bytes  # called from the download's threads after each update

    def record(self, bar: int, n: float, total: float | None) -> None:
        with self._lock:
            self._bars[bar] = (n, total or 0.0)
        self.on_bytes()

    def expected_mb(self) -> float:
        """The size of what is being fetched, as far as the download has told (0 before)."""
        with self._lock:
            return max((total for _, total in self._bars.values()), default=0.0) / 2**20

    def fraction(self) -> float | None:
        """Done over expected of the furthest byte bar, 0..1; None before any bytes."""
        with self._lock:
            shares = [min(n / total, 1.0) for n, total in self._bars.values() if total > 0]
        return max(shares) if shares else None

    def bar_class(self) -> type:
        """A tqdm class for huggingface_hub whose byte bars report to this meter."""
        meter = self

        class MeterBar(tqdm):  # type: ignore[misc]  # tqdm ships no type hints
            monitor_interval = 0  # no tqdm monitor thread per download

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs["file"] = _DISCARD
                super().__init__(*args, **kwargs)
                self._bytes = kwargs.get("unit") == "B"

            def update(self, n: float | None = 1) -> Any:
                shown = super().update(n)
                if self._bytes:
                    meter.record(id(self), self.n, self.total)
                return shown

        return MeterBar


def fetch_snapshot(
    repo_id: str,
    cache_dir: Path,
    patterns: list[str] | None,
    meter: ByteMeter,
    endpoint: str | None = None,
) -> str:
    """Download `repo_id` (the files matching `patterns`) into `cache_dir`; its local path.
    `endpoint`: the Hub's URL (None: huggingface_hub's own choice, `HF_ENDPOINT`).
    Blocking: run it in a thread. Raises huggingface_hub's errors as they are."""
    from huggingface_hub import snapshot_download

    path: str = snapshot_download(
        repo_id,
        cache_dir=str(cache_dir),
        allow_patterns=patterns,
        etag_timeout=10,
        endpoint=endpoint,
        tqdm_class=meter.bar_class(),
    )
    return path


Report = Callable[[ByteMeter, float], Awaitable[bool]]
"""`report(meter, now)`: the bytes done so far, at `now`; True: stop waiting for the rest."""


async def fetch_reporting(
    repo_id: str,
    cache_dir: Path,
    patterns: list[str] | None,
    report: Report,
    clock: Callable[[], float],
    every_s: float,
) -> str | None:
    """`fetch_snapshot` in a thread, `report`ed as its bytes move (at most every `every_s`
    on `clock`); its local path, or None when a report said to stop (the thread still
    finishes the file; nothing uses it). Raises huggingface_hub's errors as they are."""
    loop = asyncio.get_running_loop()
    moved = asyncio.Event()

    def bytes_moved() -> None:  # in the download's thread
        loop.call_soon_threadsafe(moved.set)

    meter = ByteMeter(on_bytes=bytes_moved)
    fetch = asyncio.ensure_future(
        asyncio.to_thread(fetch_snapshot, repo_id, cache_dir, patterns, meter)
    )
    # A cancelled caller stops waiting; the thread still ends, and its outcome is nobody's.
    fetch.add_done_callback(lambda f: f.cancelled() or f.exception())
    written = clock()
    while not fetch.done():
        waiter = asyncio.ensure_future(moved.wait())
        await asyncio.wait({fetch, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        moved.clear()
        now = clock()
        if fetch.done() or now - written < every_s:
            continue
        written = now
        if await report(meter, now):
            return None
    return fetch.result()

"""Progress for the long steps of the install scripts: a bar with percent and elapsed time
on a terminal, a line every few percent when not on one (CI logs, `scripts/run | tee`).

Standard library only: scripts/install-llama-server runs it with the system Python, before
any venv exists.

As a program, it runs a command, keeps its output in a log and follows it:

    progress.py --label TEXT --log FILE --follow cmake -- cmake --build ...
    progress.py --label TEXT --log FILE --follow pip --site DIR -- pip install ...
    progress.py --label TEXT --log FILE --follow download -- pip download ...

- `cmake`: the percent of the build is make's own (`[ 45%] Building ...`);
- `pip`: while pip collects, the number of packages found; once it prints `Installing
  collected packages: ...`, the percent is the share of those packages whose `.dist-info`
  is in `--site` (pip writes it as the last step of each package's install);
- `download`: one file's bytes, from pip's `--progress-bar raw` lines (`Progress N of M`);
- `none`: elapsed time only.

When the command fails, the last 40 lines of its output are shown; the exit code is the
command's. As a module (the Python steps: model assembly, conversion), `Progress(label)`
with `update(fraction)` and `finish()`, `Steps` for one made of weighed phases, and
`copy_with_progress(sources, total, dest, label)`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

STEP_PERCENT = 5
"""Without a terminal, a line each time the percent crosses a multiple of this."""
MIN_LINE_GAP_S = 2.0
"""Without a terminal, at most one percent line this often: a short step writes a few lines."""
HEARTBEAT_S = 30.0
"""Without a terminal, a line at least this often, so a log shows life."""
BAR_WIDTH = 24


def elapsed_text(seconds: float) -> str:
    """`45s`, `3m12s`, `1h02m`."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """One step's progress: `update(fraction, note)` as it moves, `finish(ok)` at the end.

    On a terminal one line is redrawn (at most 5 times a second, and every second by
    `tick()` so the clock moves while nothing else does); otherwise a line is written each
    time the percent crosses a multiple of `step` (at most one every 2 s), and at least one
    every `heartbeat` seconds.
    """

    def __init__(
        self,
        label: str,
        stream: IO[str] | None = None,
        tty: bool | None = None,
        step: int = STEP_PERCENT,
        heartbeat: float = HEARTBEAT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.step = step
        self.heartbeat = heartbeat
        self.clock = clock
        self.started = clock()
        self.fraction: float | None = None
        self.note = ""
        self._lock = threading.Lock()
        self._drawn_at = -1.0
        self._last_step = -1
        self._last_line_at = self.started
        self._stop: threading.Event | None = None
        self._ticker: threading.Thread | None = None
        if not self.tty:
            self._line(f"{label} ...")

    def update(self, fraction: float | None = None, note: str | None = None) -> None:
        """Move to `fraction` (0..1; None keeps the last) and show `note` beside it."""
        with self._lock:
            if fraction is not None:
                self.fraction = min(1.0, max(self.fraction or 0.0, fraction))
            if note is not None:
                self.note = note
            self._show(force=False)

    def tick(self) -> None:
        """Redraw the clock (terminal) or write the heartbeat (log) when it is due."""
        with self._lock:
            self._show(force=False, ticking=True)

    def keep_ticking(self, every: float = 0.5) -> None:
        """`tick()` from a thread of its own until `finish()`: for a step whose phases
        report nothing for minutes (the clock still moves, the log still gets its line)."""
        stop = self._stop = threading.Event()

        def loop() -> None:
            while not stop.wait(every):
                self.tick()

        self._ticker = threading.Thread(target=loop, daemon=True)
        self._ticker.start()

    @property
    def ticking(self) -> bool:
        """Whether the thread of `keep_ticking` is running."""
        return self._ticker is not None and self._ticker.is_alive()

    def finish(self, ok: bool = True) -> float:
        """The last line: done (or failed) after the elapsed time, which is returned. The
        ticking thread has ended before it is written, so no heartbeat comes after it."""
        if self._stop is not None:
            self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            spent = self.clock() - self.started
            word = "done" if ok else "failed"
            if self.tty:
                self.stream.write("\r\x1b[K")
            self._line(f"{self.label}: {word} in {elapsed_text(spent)}")
            return spent

    def _show(self, force: bool, ticking: bool = False) -> None:
        now = self.clock()
        spent = elapsed_text(now - self.started)
        pct = None if self.fraction is None else int(self.fraction * 100)
        if self.tty:
            if not force and now - self._drawn_at < (1.0 if ticking else 0.2):
                return
            self._drawn_at = now
            if pct is None:
                text = f"{self.label}  {spent}"
            else:
                filled = int(BAR_WIDTH * pct / 100)
                bar = "#" * filled + "-" * (BAR_WIDTH - filled)
                text = f"{self.label} [{bar}] {pct:3d}%  {spent}"
            if self.note:
                text += f"  {self.note}"
            self.stream.write("\r\x1b[K" + text[: _columns() - 1])
            self.stream.flush()
            return
        if (
            pct is not None
            and pct // self.step > self._last_step
            and now - self._last_line_at >= min(MIN_LINE_GAP_S, self.heartbeat)
        ):
            self._last_step = pct // self.step
            self._line(
                f"{self.label}: {pct}% after {spent}" + (f" ({self.note})" if self.note else "")
            )
        elif now - self._last_line_at >= self.heartbeat:  # a long phase without a percent
            self._line(f"{self.label}: {spent}" + (f" ({self.note})" if self.note else ""))

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()
        self._last_line_at = self.clock()


class Steps:
    """A step made of phases of known relative weight (measured once): the percent is the
    weight of the phases done, plus the phase in progress's own share when it reports one
    (`within`). The phase's name is the note."""

    def __init__(self, progress: Progress, phases: list[tuple[str, float]]) -> None:
        self.progress = progress
        total = sum(w for _, w in phases)
        self.starts: dict[str, tuple[float, float]] = {}
        at = 0.0
        for name, weight in phases:
            self.starts[name] = (at / total, weight / total)
            at += weight
        self.current = phases[0][0]

    def start(self, name: str) -> None:
        self.current = name
        self.progress.update(self.starts[name][0], name)

    def within(self, fraction: float) -> None:
        start, share = self.starts[self.current]
        self.progress.update(start + share * min(1.0, fraction))


def _columns() -> int:
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns or 100
    except OSError:
        return 100


def copy_with_progress(sources: Iterable[IO[bytes]], total: int, dest: Path, label: str) -> str:
    """Concatenate the open `sources` (`total` bytes in all) into `dest` 1 MiB at a time,
    with the bytes as progress; the sha256 of what was written."""
    progress = Progress(label)
    digest = hashlib.sha256()
    done = 0
    try:
        with dest.open("wb") as out:
            for src in sources:
                while block := src.read(1 << 20):
                    out.write(block)
                    digest.update(block)
                    done += len(block)
                    progress.update(done / max(total, 1), f"{done >> 20} of {total >> 20} MiB")
    except BaseException:
        progress.finish(ok=False)
        raise
    progress.finish()
    return digest.hexdigest()


# -- following a command's output ------------------------------------------------------------

CMAKE_PERCENT = re.compile(r"^\[\s*(\d+)%\]")
PIP_COLLECTING = re.compile(r"^Collecting (\S+)")
PIP_INSTALLING = re.compile(r"^Installing collected packages: (.+)$")
PIP_RAW = re.compile(r"^Progress (\d+) of (\d+)$")


def normalized(name: str) -> str:
    """A distribution name as its `.dist-info` folder spells it, lower-cased."""
    return re.sub(r"[-_.]+", "_", name).lower()


class Follower:
    """Reads a command's output line by line and moves a `Progress` (see the module doc)."""

    def __init__(self, progress: Progress, mode: str, site: Path | None = None) -> None:
        self.progress = progress
        self.mode = mode
        self.site = site
        self.collected = 0
        self.installing: set[str] = set()

    def line(self, text: str) -> None:
        text = text.strip()
        if self.mode == "cmake":
            if m := CMAKE_PERCENT.match(text):
                self.progress.update(int(m.group(1)) / 100)
        elif self.mode == "download":
            if (m := PIP_RAW.match(text)) and int(m.group(2)) > 0:
                got, total = int(m.group(1)), int(m.group(2))
                self.progress.update(got / total, f"{got >> 20} of {total >> 20} MiB")
        elif self.mode == "pip":
            if PIP_COLLECTING.match(text):
                self.collected += 1
                self.progress.update(note=f"collecting: {self.collected} packages")
            elif m := PIP_INSTALLING.match(text):
                self.installing = {normalized(n) for n in m.group(1).split(", ")}
                self.progress.update(0.0, f"installing {len(self.installing)} packages")

    def poll(self) -> None:
        """pip mode: the share of the packages being installed whose metadata is written."""
        if self.mode != "pip" or not self.installing or self.site is None:
            return
        try:
            names = os.listdir(self.site)
        except OSError:
            return
        done = {normalized(n.split("-")[0]) for n in names if n.endswith(".dist-info")}
        count = len(self.installing & done)
        self.progress.update(
            count / len(self.installing), f"{count} of {len(self.installing)} packages"
        )


def follow(argv: list[str], label: str, log: Path, mode: str, site: Path | None) -> int:
    """Run `argv`, its output into `log`, the progress on stderr; the command's exit code."""
    progress = Progress(label)
    follower = Follower(progress, mode, site)
    stop = threading.Event()

    def ticker() -> None:
        while not stop.wait(0.5):
            follower.poll()
            progress.tick()

    thread = threading.Thread(target=ticker, daemon=True)
    with (
        log.open("w") as out,
        subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        ) as proc,
    ):
        thread.start()
        assert proc.stdout is not None
        for text in proc.stdout:
            out.write(text)
            follower.line(text)
        code = proc.wait()
    stop.set()
    thread.join()
    if code == 0:
        follower.poll()
        progress.update(1.0 if progress.fraction is not None else None)
    progress.finish(ok=code == 0)
    if code != 0:
        lines = [t for t in log.read_text(errors="replace").splitlines() if "is ignored" not in t]
        sys.stderr.write("\n".join(lines[-40:]) + "\n")
    return code


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--follow", choices=["cmake", "pip", "download", "none"], default="none")
    parser.add_argument("--site", type=Path, help="pip: the site-packages it installs into")
    parser.add_argument("command", nargs="+")
    opts = parser.parse_args(args)
    return follow(opts.command, opts.label, opts.log, opts.follow, opts.site)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

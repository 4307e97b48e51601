"""The supervisor runs real fake-engine subprocesses, one per failure mode."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import httpx
import pytest

from adapters.errors import EngineStartFailed, IllegalEngineTransition
from adapters.supervisor import EngineProcess, EngineState, HealthCheck, LogRing
from tests.fixtures.launch import REPO_ROOT
from tests.support.ports import free_port


def _fake(module: str, port: int, *args: str) -> list[str]:
    return [sys.executable, "-m", f"tests.fixtures.{module}", "--port", str(port), *args]


def _health(port: int) -> HealthCheck:
    async def check() -> bool:
        async with httpx.AsyncClient(timeout=1.0) as client:
            r = await client.get(f"http://127.0.0.1:{port}/health")
            return r.status_code == 200

    return check


def _engine(module: str, *args: str, timeout: float = 20.0) -> tuple[EngineProcess, int]:
    port = free_port()
    proc = EngineProcess(
        name=module,
        argv=_fake(module, port, *args),
        health=_health(port),
        env={"PYTHONPATH": str(REPO_ROOT)},
        load_timeout_s=timeout,
    )
    return proc, port


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


async def test_supervisor_healthy_engine_becomes_ready_and_stops() -> None:
    """A healthy engine reaches READY; stop() ends it with SIGTERM and reads STOPPED."""
    proc, _port = _engine("fake_openai")
    await proc.start()
    assert proc.state is EngineState.READY
    assert proc.pid is not None and os.getpgid(proc.pid) == proc.pid  # its own group
    info = await proc.stop(grace_s=5)
    assert proc.state is EngineState.STOPPED
    assert info is not None and info.expected
    assert not _alive(proc.pid)


async def test_supervisor_exit_at_start_fails_with_code_and_log() -> None:
    """An engine that exits while starting fails at once with its exit code; its last lines
    ride in the error's `log` field, never in its message."""
    proc, _ = _engine("fake_crashes_on_start", "--exit-code", "3")
    with pytest.raises(EngineStartFailed) as err:
        await proc.start()
    assert proc.state is EngineState.FAILED
    assert err.value.exit_code == 3
    assert "exit code 3" in str(err.value)
    assert "exiting due to model loading error" not in str(err.value)
    assert any("exiting due to model loading error" in line for line in err.value.log)


async def test_supervisor_never_healthy_fails_after_timeout_with_log() -> None:
    """An engine whose health never answers fails after the load timeout, process stopped."""
    proc, _ = _engine("fake_hangs", "--hang-health", timeout=1.5)
    with pytest.raises(EngineStartFailed) as err:
        await proc.start()
    assert proc.state is EngineState.FAILED
    assert "did not become healthy within 1.5 s" in str(err.value)
    assert proc.pid is not None and not _alive(proc.pid)


async def test_supervisor_slow_load_is_not_a_failure_before_timeout() -> None:
    """An engine answering 503 'Loading model' for a while becomes READY within the timeout."""
    proc, _ = _engine("fake_openai", "--load-ms", "1500")
    await proc.start()
    assert proc.state is EngineState.READY
    await proc.stop()


async def test_supervisor_crash_after_ready_marks_failed_and_calls_back() -> None:
    """kill -9 of a ready engine: FAILED with the signal, exit callbacks run."""
    proc, _ = _engine("fake_openai")
    seen: list[EngineState] = []
    done = asyncio.Event()

    def on_exit(p: EngineProcess) -> None:
        seen.append(p.state)
        done.set()

    proc.on_exit(on_exit)
    await proc.start()
    assert proc.pid is not None
    os.kill(proc.pid, 9)
    await asyncio.wait_for(done.wait(), 10)
    assert seen == [EngineState.FAILED]
    assert proc.exit is not None and proc.exit.returncode == -9 and not proc.exit.expected
    assert "SIGKILL" in proc.exit.describe()
    await proc.stop()
    assert proc.state is EngineState.STOPPED


async def test_supervisor_stop_of_a_crashed_engine_signals_no_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An engine that died (FAILED) and is stopped later (an unload, the runner's shutdown):
    no signal goes to its old group id. Reaped, that number may be another session's by
    then (another runner's, say, which the SIGKILL would end without a word)."""
    proc, _ = _engine("fake_openai")
    await proc.start()
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    await asyncio.wait_for(proc.wait_exit(), 10)
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append((pgid, sig)))
    await proc.stop()
    assert proc.state is EngineState.STOPPED
    assert sent == []


async def test_supervisor_kill_of_a_stopped_engine_is_a_crash_named_by_its_cause() -> None:
    """`kill(cause)` of a READY engine frozen with SIGSTOP (a hang), and of what it forked:
    the whole group ends, FAILED, the exit callbacks run, and the exit (not expected: a
    crash) is described by the cause; a second kill, or one of an engine not READY, does
    nothing."""
    port = free_port()
    fake = " ".join(_fake("fake_openai", port))
    proc = EngineProcess(
        name="frozen",
        argv=["sh", "-c", f"sleep 60 & exec {fake}"],
        health=_health(port),
        env={"PYTHONPATH": str(REPO_ROOT)},
        load_timeout_s=20,
    )
    assert not proc.kill("never started")
    ran: list[EngineState] = []
    proc.on_exit(lambda p: ran.append(p.state))
    await proc.start()
    assert proc.pid is not None
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text()
    [forked] = [int(pid) for pid in children.split()]
    os.kill(proc.pid, signal.SIGSTOP)
    assert proc.kill("hung: stopped answering /health")
    assert not proc.kill("again")
    info = await asyncio.wait_for(proc.wait_exit(), 10)
    assert ran == [EngineState.FAILED] and not info.expected and info.returncode == -9
    assert info.describe() == "hung: stopped answering /health (SIGKILL, exit code -9)"
    assert await proc.died_within(1.0) == f"exited ({info.describe()})"
    assert not _alive(forked)
    await proc.stop()


async def test_supervisor_exit_is_heard_after_the_exit_callbacks() -> None:
    """kill -9 of an engine whose child keeps its output open (as vLLM's engine core does):
    `died_within` answers how it died only once the exit callbacks ran (the pool reported
    the crash), so a request cut by the crash never ends before the scheduler knows."""
    port = free_port()
    fake = " ".join(_fake("fake_openai", port))
    proc = EngineProcess(
        name="holds-output",
        argv=["sh", "-c", f"sleep 5 & exec {fake}"],
        health=_health(port),
        env={"PYTHONPATH": str(REPO_ROOT)},
        load_timeout_s=20,
    )
    ran: list[EngineState] = []
    proc.on_exit(lambda p: ran.append(p.state))
    await proc.start()
    assert proc.pid is not None
    os.kill(proc.pid, 9)
    how = await proc.died_within(5.0)
    assert ran == [EngineState.FAILED]  # the callbacks ran first
    assert how is not None and "SIGKILL" in how
    await proc.stop()


async def test_supervisor_exit_callback_added_after_the_exit_is_still_called() -> None:
    """An engine that dies between turning READY and its owner asking to hear of its exit
    (the pool files it a moment later) is not forgotten: a callback added after the exit
    was handled is called all the same, so the crash is still reported."""
    port = free_port()
    proc = EngineProcess(
        name="dies-early",
        argv=_fake("fake_openai", port),
        health=_health(port),
        env={"PYTHONPATH": str(REPO_ROOT)},
        load_timeout_s=20,
    )
    await proc.start()
    assert proc.pid is not None
    os.kill(proc.pid, 9)
    assert await proc.died_within(5.0) is not None  # the exit is handled: callbacks ran
    heard = asyncio.Event()
    proc.on_exit(lambda p: heard.set())
    async with asyncio.timeout(5):
        await heard.wait()
    await proc.stop()


async def test_supervisor_flooding_logs_stay_bounded() -> None:
    """A flood of output keeps the ring at its line cap, each line cut at 4 KiB."""
    port = free_port()
    proc = EngineProcess(
        name="flood",
        argv=_fake("fake_floods_logs", port),
        health=_health(port),
        load_timeout_s=20,
        log_lines=100,
    )
    await proc.start()
    async with asyncio.timeout(15):
        while proc.ring.total_lines < 2000:
            await asyncio.sleep(0.05)
    lines = proc.logs()
    assert len(lines) == 100
    assert max(len(line) for line in lines) <= 4096
    await proc.stop(grace_s=5)


async def test_supervisor_sigterm_ignored_gets_sigkill() -> None:
    """An engine that ignores SIGTERM is killed after the grace period."""
    port = free_port()
    script = (
        "import signal,time,http.server,threading\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"s=http.server.HTTPServer(('127.0.0.1',{port}),http.server.SimpleHTTPRequestHandler)\n"
        "threading.Thread(target=s.serve_forever,daemon=True).start()\n"
        "time.sleep(600)\n"
    )

    async def check() -> bool:
        async with httpx.AsyncClient(timeout=1.0) as client:
            return (await client.get(f"http://127.0.0.1:{port}/")).status_code < 500

    proc = EngineProcess(name="stubborn", argv=[sys.executable, "-c", script], health=check)
    await proc.start()
    info = await proc.stop(grace_s=0.5)
    assert info is not None and info.returncode == -9


async def test_supervisor_missing_executable_fails_clearly() -> None:
    """A binary that does not exist fails the start with the OS's reason."""

    async def never() -> bool:
        return False

    proc = EngineProcess(name="ghost", argv=["/nonexistent/llama-server"], health=never)
    with pytest.raises(EngineStartFailed, match="could not be started"):
        await proc.start()
    assert proc.state is EngineState.FAILED


async def test_supervisor_illegal_transition_raises() -> None:
    """A second start() is refused by the state table."""
    proc, _ = _engine("fake_openai")
    await proc.start()
    with pytest.raises(IllegalEngineTransition):
        await proc.start()
    await proc.stop()


def test_log_ring_keeps_last_lines_and_partial() -> None:
    """The ring keeps the last N complete lines; a partial line waits for its newline."""
    ring = LogRing(max_lines=2)
    ring.feed(b"a\nb\nc")
    assert ring.tail() == ["a", "b"]
    ring.feed(b"d\n")
    assert ring.tail() == ["b", "cd"]
    ring.feed(b"tail-without-newline")
    ring.close()
    assert ring.tail() == ["cd", "tail-without-newline"]

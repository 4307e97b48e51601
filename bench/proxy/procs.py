"""The processes under test: the runner as a subprocess, CPU accounting, machine facts.

The runner is started as `python -m runner` in its own process group, bound to 127.0.0.1,
configured only by environment variables, and killed with its group (SIGTERM, then SIGKILL)
when the block ends, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
_CLK_TCK = os.sysconf("SC_CLK_TCK")


class StartError(RuntimeError):
    """A process under test did not come up."""


@dataclass
class RunnerProc:
    proc: subprocess.Popen[bytes]
    port: int
    env: dict[str, str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


Targets = tuple[dict[str, str], dict[str, dict[str, int]]]
"""(each side's URL, the processes whose CPU each side's run counts): "direct" is the
engine alone, every other side a runner in front of it; "all" watches every process."""


def targets_of(
    engine_url: str, engine_pid: int, runners: dict[str, RunnerProc], path: str
) -> Targets:
    """The URLs `path` is asked at, direct and through each runner, and what to watch."""
    urls = {"direct": engine_url + path}
    urls.update({side: proc.url + path for side, proc in runners.items()})
    pids = {side: proc.proc.pid for side, proc in runners.items()}
    watch = {
        "direct": {"engine": engine_pid},
        **{side: {"engine": engine_pid, "runner": pid} for side, pid in pids.items()},
        "all": {"engine": engine_pid, **pids},
    }
    return urls, watch


def free_port() -> int:
    """A port the kernel says is free right now (the runner binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _kill_group(proc: subprocess.Popen[bytes], grace_s: float = 3.0) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StartError(f"runner exited with code {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1.0) as resp:
                if resp.status == 200:
                    return
                last = f"status {resp.status}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.1)
    raise StartError(f"runner not healthy within {timeout:g} s ({last})")


CODE_PACKAGES = ("runner", "adapters", "tenants", "governance", "faults")
"""The packages a ref's snapshot holds (those of them the ref has: `faults` came later)."""


@contextlib.contextmanager
def code_snapshot(ref: str | None, extra: tuple[str, ...] = ()) -> Iterator[Path]:
    """The directory to run the runner from: the work tree, or `ref`'s packages extracted.

    Other people edit the shared work tree while benchmarks run; `--ref HEAD` measures the
    last commit instead of whatever is half-edited. `python -m` puts the current directory
    first on sys.path, so the extracted packages win over the editable install.
    """
    if ref is None:
        yield REPO_ROOT
        return
    with tempfile.TemporaryDirectory(prefix="bench-proxy-code-") as tmp:
        packages = [p for p in CODE_PACKAGES if _git("ls-tree", "--name-only", ref, p)]
        archive = subprocess.run(
            ["git", "archive", ref, *packages, *extra],
            cwd=REPO_ROOT,
            capture_output=True,
            check=True,
        )
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        yield Path(tmp)


def resolve_ref(ref: str) -> str:
    return _git("rev-parse", "--short", ref + "^{commit}")


FEATURES_ON = {"DEFAULT_RATE_LIMIT": "100000000req/min", "MAX_QUEUE_DEPTH": "1024"}
"""The proxy bench's limits: the limiter and the queue run, but never refuse."""


@contextlib.contextmanager
def start_runner(
    engine_url: str,
    parallel: int,
    code_dir: Path = REPO_ROOT,
    timeout: float = 30.0,
    *,
    env: dict[str, str] | None = None,
    module: str = "runner",
    log_format: str = "json",
    prefix: Sequence[str] = (),
    grace_s: float = 3.0,
    backend: str = "openai",
) -> Iterator[RunnerProc]:
    """Run `python -m <module>` from `code_dir`, attached to `engine_url` as `echo` (of
    kind `backend`: `openai`, or `llama-server` for what the runner knows of one).

    `env` sets the runner's limits (default `FEATURES_ON`); the caller's own REDIS_URL,
    rate-limit and queue variables are never inherited, so only `env` decides them.
    `prefix` goes before the command (a profiler); `grace_s` is how long the runner has
    to stop on SIGTERM before it is killed.
    """
    with tempfile.TemporaryDirectory(prefix="bench-runner-") as tmp:
        models = Path(tmp) / "models.yaml"
        models.write_text(
            "models:\n"
            "  - id: echo\n"
            f"    backend: {backend}\n"
            f"    url: {engine_url}\n"
            f"    parallel: {parallel}\n"
        )
        port = free_port()
        own = {
            "HOST": "127.0.0.1",
            "PORT": str(port),
            "LOG_LEVEL": "info",
            "LOG_FORMAT": log_format,
            "ENABLE_METRICS": "true",
            "ENABLE_MULTI_TENANT": "true",
            **(FEATURES_ON if env is None else env),
        }
        drop = ("REDIS_URL", "DEFAULT_RATE_LIMIT", "MAX_QUEUE_DEPTH", "QUEUE_TIMEOUT_MS")
        full_env = {
            k: v
            for k, v in os.environ.items()
            if k not in drop and not k.startswith("TENANT_RATE_LIMIT_")
        }
        full_env.update(own, MODELS_CONFIG=str(models))
        log_path = Path(tmp) / "runner.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", module],
                cwd=code_dir,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                try:
                    _wait_healthy(proc, f"http://127.0.0.1:{port}", timeout)
                except StartError as exc:
                    tail = log_path.read_bytes()[-3000:].decode(errors="replace")
                    raise StartError(f"{exc}\n--- runner output ---\n{tail}") from None
                yield RunnerProc(proc, port, own)
            finally:
                _kill_group(proc, grace_s)


def cpu_seconds(pid: int) -> float:
    """CPU time of a live process, all its threads, in seconds (0.0 if it is gone).

    From `/proc/<pid>/task/*/schedstat` (nanoseconds on a CPU, exact), because
    `/proc/<pid>/stat`'s utime/stime are sampled at clock ticks, which over-charges a
    process that wakes up briefly and often - exactly what a proxy at low load does.
    """
    total_ns = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                total_ns += int((task / "schedstat").read_text().split()[0])
    except OSError:
        return _stat_cpu_seconds(pid)
    return total_ns / 1e9 if total_ns else _stat_cpu_seconds(pid)


def _stat_cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the ")" the fields start at state (3rd field); utime, stime are fields 14, 15.
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def machine_cpu_busy_s() -> float:
    """CPU seconds the whole machine spent busy since boot (all cores, from /proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / _CLK_TCK


def cpu_pressure_us() -> int:
    """Total microseconds some task waited for a CPU (PSI `some`), or 0 if unavailable."""
    try:
        first = Path("/proc/pressure/cpu").read_text().split("\n", 1)[0]
    except OSError:
        return 0
    return int(first.rsplit("total=", 1)[1])


def others_cores(watch: dict[str, int], seconds: float = 1.0) -> float:
    """Cores used over `seconds` by everything except the `watch`ed processes (and this one)."""
    pids = [*watch.values(), os.getpid()]
    busy0, ours0 = machine_cpu_busy_s(), sum(cpu_seconds(p) for p in pids)
    time.sleep(seconds)
    busy1, ours1 = machine_cpu_busy_s(), sum(cpu_seconds(p) for p in pids)
    return max(0.0, (busy1 - busy0) - (ours1 - ours0)) / seconds


def wait_quiet(watch: dict[str, int], below: float, max_wait_s: float) -> dict[str, float]:
    """Wait (at most `max_wait_s`) until the rest of the machine uses < `below` cores."""
    start = time.monotonic()
    others = others_cores(watch)
    while others >= below and time.monotonic() - start < max_wait_s:
        others = others_cores(watch)
    return {"waited_s": round(time.monotonic() - start, 1), "others_cores": round(others, 2)}


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()


def wrk_version() -> str:
    try:
        out = subprocess.run(["wrk", "-v"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = (out.stdout + out.stderr).split()
    # "wrk debian/4.1.0-3+b2 [epoll] Copyright ..." -> "wrk debian/4.1.0-3+b2"
    return " ".join(text[:2]) if text else "unknown"


def require_wrk() -> None:
    if shutil.which("wrk") is None:
        sys.exit(
            "bench/proxy needs the `wrk` load generator on PATH.\n"
            "Install it with:  sudo apt-get install -y wrk   (Debian/Ubuntu)\n"
            "or build it from https://github.com/wg/wrk"
        )


def machine_facts() -> dict[str, object]:
    return {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "wrk": wrk_version(),
        "git_head": _git("rev-parse", "--short", "HEAD"),
        "uncommitted_in_tested_code": _git("status", "--porcelain", "runner", "adapters"),
    }

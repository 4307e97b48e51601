"""The systems under test on the real engine: llama-server started by hand, and the runner
that starts its own llama-server from a models file.

Both come up on 127.0.0.1 in their own process group and are killed with it (SIGTERM,
grace, SIGKILL) when the block ends, whatever happened. `bench/coldload` uses the same
helpers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from adapters.llama_server.kind import default_binary as default_llama_server_bin
from bench.proxy.procs import REPO_ROOT, free_port

LLAMA_BIN = os.environ.get("LLAMA_SERVER_BIN") or default_llama_server_bin()
MODEL_PATH = Path("~/.cache/quorum/models/gemma-3-270m-q4_k_m.gguf").expanduser()
MODEL_ID = "gemma"

RUNNER_ENV = {
    "ENABLE_MULTI_TENANT": "true",
    "ENABLE_METRICS": "true",
    "DEFAULT_RATE_LIMIT": "100000000req/min",
    "MAX_QUEUE_DEPTH": "1024",
    "QUEUE_TIMEOUT_MS": "600000",
}
"""All features on, limits that never refuse: the bench measures the engine path only."""


class StartError(RuntimeError):
    """A process under test did not come up."""


@dataclass
class Served:
    """One system under test: where to send requests and what to send as `model`."""

    name: str
    url: str
    proc: subprocess.Popen[bytes]
    model: str
    log_path: Path
    argv: list[str] = field(default_factory=list)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def require_engine() -> None:
    missing = [p for p in (LLAMA_BIN, str(MODEL_PATH)) if not os.path.exists(p)]
    if missing:
        sys.exit(f"the real engine is not installed ({', '.join(missing)}): run scripts/install")


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM the process group, wait `grace_s`, then SIGKILL whatever is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def health_ok(url: str, timeout: float = 1.0) -> bool:
    """One GET /health on a fresh connection: True on 200."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(
    proc: subprocess.Popen[bytes], url: str, timeout: float, poll_s: float = 0.05
) -> float:
    """Poll /health until 200; the monotonic time it answered. StartError if it never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StartError(f"exited with code {proc.returncode} before it was healthy")
        if health_ok(url):
            return time.monotonic()
        time.sleep(poll_s)
    raise StartError(f"not healthy within {timeout:g} s")


def direct_argv(parallel: int, ctx_per_slot: int, port: int, extra: Sequence[str]) -> list[str]:
    """llama-server with its defaults: only the model, address, slots and total context.

    The runner passes `--ctx-size` = context_length x parallel (each slot gets the model's
    context), so the hand-started engine gets the same total.
    """
    return [
        LLAMA_BIN,
        "-m",
        str(MODEL_PATH),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--parallel",
        str(parallel),
        "--ctx-size",
        str(ctx_per_slot * parallel),
        *extra,
    ]


@contextlib.contextmanager
def spawn_llama(argv: list[str], name: str = "direct") -> Iterator[Served]:
    """Start llama-server with exactly `argv` (its `--port` must be in it); yield when healthy."""
    port = int(argv[argv.index("--port") + 1])
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="bench-llama-") as tmp:
        log_path = Path(tmp) / "llama.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        served = Served(name, url, proc, MODEL_ID, log_path, argv)
        try:
            try:
                wait_healthy(proc, url, timeout=120.0)
            except StartError as exc:
                raise StartError(f"llama-server {exc}\n{served.log()[-3000:]}") from None
            yield served
        finally:
            kill_group(proc)


def models_yaml(parallel: int, ctx_per_slot: int, extra: Sequence[str], preload: bool) -> str:
    args = ", ".join(f'"{a}"' for a in extra)
    return (
        "models:\n"
        f"  - id: {MODEL_ID}\n"
        "    backend: llama-server\n"
        f"    path: {MODEL_PATH}\n"
        f"    context_length: {ctx_per_slot}\n"
        f"    parallel: {parallel}\n"
        f"    preload: {'true' if preload else 'false'}\n"
        f"    args: [{args}]\n"
    )


def runner_env(port: int, models_path: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The runner's environment: the caller's, minus anything that would change its limits."""
    drop = ("REDIS_URL", "DEFAULT_RATE_LIMIT", "MAX_QUEUE_DEPTH", "QUEUE_TIMEOUT_MS")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in drop and not k.startswith("TENANT_RATE_LIMIT_")
    }
    env.update(RUNNER_ENV)
    env.update(
        HOST="127.0.0.1",
        PORT=str(port),
        LOG_FORMAT="text",
        LOG_LEVEL="info",
        MODELS_CONFIG=str(models_path),
        LLAMA_SERVER_BIN=LLAMA_BIN,
    )
    env.update(extra or {})
    return env


@contextlib.contextmanager
def start_runner(
    models_file: str,
    env: dict[str, str] | None = None,
    timeout: float = 180.0,
    code_dir: Path = REPO_ROOT,
) -> Iterator[Served]:
    """`python -m runner` with `models_file`; yield once /health answers 200 (after preload)."""
    with tempfile.TemporaryDirectory(prefix="bench-runner-") as tmp:
        models_path = Path(tmp) / "models.yaml"
        models_path.write_text(models_file)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = Path(tmp) / "runner.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "runner"],
                cwd=code_dir,
                # saved prefixes of its own: no run inherits another's (PREFIX_CACHE_DIR)
                env=runner_env(
                    port, models_path, {"PREFIX_CACHE_DIR": f"{tmp}/prefixes", **(env or {})}
                ),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        served = Served("runner", url, proc, MODEL_ID, log_path)
        try:
            try:
                wait_healthy(proc, url, timeout)
            except StartError as exc:
                raise StartError(f"runner {exc}\n{served.log()[-3000:]}") from None
            yield served
        finally:
            kill_group(proc, grace_s=15.0)


@contextlib.contextmanager
def start_direct(parallel: int, ctx_per_slot: int, extra: Sequence[str]) -> Iterator[Served]:
    with spawn_llama(direct_argv(parallel, ctx_per_slot, free_port(), extra)) as served:
        yield served


@contextlib.contextmanager
def start_system(
    name: str, parallel: int, ctx_per_slot: int, extra: Sequence[str]
) -> Iterator[Served]:
    """`runner` (multi-tenant, its own llama-server), `direct` (llama-server's defaults) or
    `direct-noram` (the defaults but `--cache-ram 0`: what turning off the shared RAM
    prompt cache alone costs, a diagnostic)."""
    if name == "runner":
        with start_runner(models_yaml(parallel, ctx_per_slot, extra, preload=True)) as s:
            yield s
    elif name == "direct-noram":
        with start_direct(parallel, ctx_per_slot, [*extra, "--cache-ram", "0"]) as s:
            s.name = name
            yield s
    elif name == "direct":
        with start_direct(parallel, ctx_per_slot, extra) as s:
            yield s
    else:
        raise ValueError(f"unknown system {name!r}")


def cmdline(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [a.decode() for a in raw.split(b"\0") if a]

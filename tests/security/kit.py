"""Shared kit for the attack suite: runners in each identity mode, tenants files with keys,
raw sockets, and what a local attacker can read of the engine processes.

Every runner here is `python -m runner` (tests/support/runner_proc.py); the engines are the
stand-ins of tests/fixtures/bin/ unless a test names a real one.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from runner.memory.proc import process_tree
from tests.support import forkserver
from tests.support.fleet import entry
from tests.support.poll import eventually
from tests.support.runner_proc import REPO_ROOT, RunnerProcess, start_runner
from tests.support.tokens import DEV_AUDIT_KEY, DEV_REGISTRY

KEYS = {
    "acme": "acme-key-0123456789abcdef0123456789abcdef",
    "globex": "globex-key-0123456789abcdef0123456789abcd",
    "ops": "ops-key-0123456789abcdef0123456789abcdef01",
}
"""Each tenant's API key (plain, at least 32 characters)."""
SECRETS = {
    "acme": "whsec_" + base64.b64encode(bytes(range(10, 42))).decode(),
    "globex": "whsec_" + base64.b64encode(bytes(range(50, 82))).decode(),
}
"""Each tenant's own webhook secret."""
SHARED_SECRET = "whsec_" + base64.b64encode(bytes(range(100, 132))).decode()
"""The global WEBHOOK_SECRET (the shared fallback)."""


def bearer(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def tenants_file(
    path: Path, tenants: dict[str, dict[str, Any]] | None = None, *, keys: bool = True
) -> Path:
    """A tenants file: every tenant of KEYS with its key (when `keys`), plus `tenants`."""
    doc: dict[str, Any] = {"tenants": {}}
    for tenant, key in KEYS.items():
        doc["tenants"][tenant] = {"api_keys": [key]} if keys else {}
    for tenant, extra in (tenants or {}).items():
        doc["tenants"].setdefault(tenant, {}).update(extra)
    path.write_text(yaml.safe_dump(doc))
    return path


def stand_in_models(binary: str = "llama-server-ok", model: str = "m", **extra: object) -> str:
    """A models file with one preloaded stand-in llama-server."""
    text = "models:\n" + entry(model, binary, preload=True)
    text += "".join(
        f"    {k}: {str(v).lower() if isinstance(v, bool) else v}\n" for k, v in extra.items()
    )
    return text


@contextmanager
def keyed_runner(
    tmp: Path,
    env: dict[str, str] | None = None,
    tenants: dict[str, dict[str, Any]] | None = None,
    models: str | None = None,
) -> Iterator[RunnerProcess]:
    """A runner in keys mode (the tenants file of KEYS), `ops` its admin, governed."""
    full = {
        "TENANTS_FILE": str(tenants_file(tmp / "tenants.yaml", tenants)),
        "ADMIN_TENANTS": "ops",
        "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
        "GOVERNANCE_AUDIT_LOG": str(tmp / "audit.jsonl"),
        "GOVERNANCE_AUDIT_KEY": str(DEV_AUDIT_KEY),
        **(env or {}),
    }
    with start_runner(models_file=models or stand_in_models(), env=full) as r:
        wait_loaded(r)
        yield r


def wait_loaded(r: RunnerProcess, timeout: float = 30.0) -> None:
    """Until every preloaded model of the runner is loaded."""

    def settled() -> bool:
        doc = httpx.get(r.url + "/v1/capabilities", timeout=5).json()
        return not doc["models"]["loading"]

    eventually(settled, timeout, "every preloaded model loaded")


def chat(url: str, headers: dict[str, str] | None = None, **body: Any) -> httpx.Response:
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    return httpx.post(url + "/v1/chat/completions", json=payload, headers=headers, timeout=30)


def start_refused(env: dict[str, str], timeout: float = 30.0) -> tuple[int | None, str]:
    """Start a runner that should refuse to start: its exit code (None: it did not exit
    within `timeout`, so it started) and its log."""
    with start_runner(models_file=stand_in_models(), env=env, wait_ready=False) as r:
        try:
            code: int | None = r.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        return code, r.log()


def quorum(*args: str) -> subprocess.CompletedProcess[str]:
    """The `quorum` command line, as an operator runs it."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = forkserver.run("runner.runtime.cli", args, env=env, timeout=60)
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def metric_lines(url: str, name: str) -> list[str]:
    text = httpx.get(url + "/metrics", timeout=5).text
    return [line for line in text.splitlines() if line.startswith((name + "{", name + " "))]


# What any local user can read of the engine processes.


def engine_pids(runner_pid: int, marker: bytes) -> list[int]:
    """The runner's descendants whose command line contains `marker`."""
    found = []
    for pid in sorted(process_tree([runner_pid]) - {runner_pid}):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in argv:
            found.append(pid)
    return found


def argv_of(pid: int) -> list[str]:
    """A process's command line, as `ps` shows it to every local user."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")


def tcp_listen_ports(pids: list[int]) -> set[int]:
    """The TCP ports (IPv4 and IPv6) that any of `pids` listens on."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def stalled_stream(port: int, body: bytes, headers: str = "") -> socket.socket:
    """A client that sends a streaming request, reads the answer's head, then stops
    reading (its receive buffer is tiny), keeping the connection open."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        + headers.encode()
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )
    head = b""
    while b"\r\n\r\n" not in head:
        got = sock.recv(1)
        if not got:
            raise AssertionError("connection closed before the answer's head")
        head += got
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def comfy_models(url: str) -> str:
    """A models file with one ComfyUI model `sd` attached at `url`."""
    from tests.support.engines import CHECKPOINT

    return f"models:\n  - {{id: sd, backend: comfyui, url: '{url}', checkpoint: {CHECKPOINT}}}\n"

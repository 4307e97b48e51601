"""Kit for the speech tests on a real runner process: models file, requests, the worker's
pid, metric values, and a webhook receiver on 127.0.0.1."""

from __future__ import annotations

import base64
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from runner.memory.proc import process_tree

TRANSCRIPTIONS = "/v1/audio/transcriptions"
SECRET = "whsec_" + base64.b64encode(bytes(range(7, 39))).decode()


def whisper_models_file(model_dir: str, model: str = "whisper", **extra: object) -> str:
    """A models file with one faster-whisper model at `model_dir`."""
    lines = ["models:", f"  - id: {model}", "    backend: faster-whisper", f"    path: {model_dir}"]
    lines += [f"    {k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def transcribe(
    url: str,
    audio: Path | bytes,
    *,
    model: str = "whisper",
    path: str = TRANSCRIPTIONS,
    headers: dict[str, str] | None = None,
    timeout: float = 60,
    **fields: str,
) -> httpx.Response:
    """POST a multipart form as OpenAI's clients do."""
    content = audio.read_bytes() if isinstance(audio, Path) else audio
    name = audio.name if isinstance(audio, Path) else "speech.wav"
    return httpx.post(
        url + path,
        data={"model": model, **fields},
        files={"file": (name, content, "application/octet-stream")},
        headers=headers,
        timeout=timeout,
    )


def worker_pids(runner_pid: int) -> list[int]:
    """The speech worker processes under the runner."""
    pids = []
    for pid in sorted(process_tree([runner_pid]) - {runner_pid}):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"adapters.whisper.worker" in cmdline:
            pids.append(pid)
    return pids


def metric(url: str, name: str, **labels: str) -> float:
    """The value of one Prometheus series on the runner's /metrics (0 when absent)."""
    text = httpx.get(url + "/metrics").text
    for line in text.splitlines():
        match = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})? (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    return 0.0


def loaded(url: str, model: str = "whisper") -> bool:
    doc = httpx.get(url + "/v1/capabilities").json()
    return model in [m["id"] for m in doc["models"]["loaded"]]


@dataclass
class Hook:
    body: bytes
    headers: dict[str, str]


@dataclass
class Receiver:
    """A webhook endpoint: records every POST (body and headers) and answers 204."""

    url: str = ""
    received: list[Hook] = field(default_factory=list)


@contextmanager
def webhook_receiver() -> Iterator[Receiver]:
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(length)
            receiver.received.append(Hook(body, {k.lower(): v for k, v in self.headers.items()}))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_port}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()

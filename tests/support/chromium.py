"""Debian's headless Chromium, driven over the DevTools protocol (no Node, no Playwright).

`open_browser()` starts `chromium` with the flags this machine needs, on a private profile
and a free DevTools port, and yields a `Page`: navigate, evaluate JavaScript, wait for a
condition, take a screenshot. The browser is killed (its process group) at the end.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def chromium_path() -> str | None:
    return shutil.which("chromium")


class Page:
    """One browser tab over its DevTools websocket (commands answered in order)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self._id = 0
        self.console: list[str] = []

    def send(self, method: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": dict(params or {})}))
        while True:
            message = json.loads(self.ws.recv(timeout=30))
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            if message.get("method") == "Runtime.exceptionThrown":
                details = message["params"]["exceptionDetails"]
                self.console.append(str(details.get("exception", {}).get("description", details)))

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete'")

    def evaluate(self, expression: str) -> Any:
        answer = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in answer:
            raise RuntimeError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        """Poll `expression` until it is truthy; its value (AssertionError after timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not true within {timeout} s: {expression}")
            time.sleep(0.1)

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path


@contextmanager
def open_browser(
    headers: Mapping[str, str] | None = None, size: tuple[int, int] = (1280, 900)
) -> Iterator[Page]:
    """A fresh headless Chromium with one tab; `headers` go with every request it makes."""
    binary = chromium_path()
    if binary is None:
        raise RuntimeError("chromium is not installed: run scripts/install-system")
    profile = Path(tempfile.mkdtemp(prefix="quorum-chromium-"))
    proc = subprocess.Popen(
        [
            binary,
            *FLAGS,
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        port = _devtools_port(profile, proc)
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page_ws = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        with connect(page_ws, max_size=None, open_timeout=10) as ws:
            page = Page(ws)
            page.send("Runtime.enable")
            page.send("Page.enable")
            page.send("Network.enable")
            if headers:
                page.send("Network.setExtraHTTPHeaders", {"headers": dict(headers)})
            yield page
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        shutil.rmtree(profile, ignore_errors=True)


def _devtools_port(profile: Path, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """Chromium writes the port it chose to DevToolsActivePort in its profile."""
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode}")
        if marker.exists():
            lines = marker.read_text().split()
            if lines:
                return int(lines[0])
        time.sleep(0.05)
    raise RuntimeError("chromium did not open its DevTools port")

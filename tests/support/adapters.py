"""The LoRA adapters scripts/make-adapters trains for Gemma 3 270M, and what tests need of
a runner's engine (its port and key, to ask it what the runner never proxies).

`scripts/test` runs scripts/make-adapters before pytest, so they are there in CI; a test
that needs them fails (never skips) when they are missing, naming the script to run. The
base model they are trained on is reached through the `real_llama_server` / `real_vllm`
fixtures (tests/support/real_engines.py), which mark the test.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.tokens import dev_token

CACHE = Path(os.environ.get("QUORUM_CACHE") or "~/.cache/quorum").expanduser()


def _recipe() -> str:
    """The recipe version scripts/make-adapters caches the adapters under (its one owner)."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "make-adapters"
    found = re.search(r'^version="(\w+)"', script.read_text(), re.M)
    assert found is not None, f"no version= line in {script}"
    return found.group(1)


ADAPTERS_DIR = CACHE / "adapters" / _recipe() / "gemma-3-270m"


@dataclass(frozen=True)
class Adapter:
    name: str
    canary: str
    rank: int
    gguf: Path
    gguf_sha256: str
    peft: Path
    peft_sha256: str


def adapters() -> dict[str, Adapter]:
    """The trained adapters by name (alpha, bravo, charlie, delta); fails when missing."""
    manifest = ADAPTERS_DIR / "manifest.json"
    if not manifest.exists():
        pytest.fail(f"LoRA adapters not made ({manifest}): run scripts/make-adapters")
    doc = json.loads(manifest.read_text())
    return {
        a["name"]: Adapter(
            a["name"],
            a["canary"],
            a["rank"],
            ADAPTERS_DIR / a["gguf"],
            a["gguf_sha256"],
            ADAPTERS_DIR / a["peft"],
            a["peft_sha256"],
        )
        for a in doc["adapters"]
    }


def canaries() -> set[str]:
    return {a.canary for a in adapters().values()}


def said(text: str) -> set[str]:
    """The canary words in `text`."""
    return {c for c in canaries() if c.lower() in text.lower()}


def chat(
    url: str, model: str, tenant: str, content: str = "Where is my parcel?", **kw: Any
) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 6,
        "temperature": 0,
        **kw,
    }
    return httpx.post(
        url + "/v1/chat/completions", json=body, headers={"X-Tenant-ID": tenant}, timeout=120
    )


def answer(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def governed(url: str, path: str, operation: str, body: dict[str, Any]) -> httpx.Response:
    """A governed adapter call: the token binds `modelId` (the adapter's id) and every
    other field of `body` as sent."""
    params = {k: v for k, v in body.items() if k != "adapterId"}
    token = dev_token(operation, body["adapterId"], params)
    return httpx.post(url + path, json={**body, "verifiedOpToken": token}, timeout=300)


def engine_of(runner_pid: int) -> tuple[str, dict[str, str]]:
    """The base URL and auth header of the llama-server this runner started (its argv and
    key file)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        if ppid == runner_pid and argv and argv[0].endswith("llama-server"):
            port = argv[argv.index("--port") + 1]
            # the runner hands the key over in a file (--api-key-file), never on argv
            key = Path(argv[argv.index("--api-key-file") + 1]).read_text().strip()
            return f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {key}"}
    raise AssertionError("no llama-server child of the runner")


def prompt_tokens(runner_pid: int, messages: list[dict[str, str]], cut_after: str) -> int:
    """How many tokens the engine makes of a chat rendered up to the end of `cut_after`
    (a public prefix's size, as the engine counts it)."""
    url, auth = engine_of(runner_pid)
    rendered = httpx.post(url + "/apply-template", json={"messages": messages}, headers=auth)
    text = rendered.json()["prompt"]
    text = text[: text.index(cut_after) + len(cut_after)]
    body = {"content": text, "add_special": True, "parse_special": True}
    tokens = httpx.post(url + "/tokenize", json=body, headers=auth).json()["tokens"]
    return len(tokens)

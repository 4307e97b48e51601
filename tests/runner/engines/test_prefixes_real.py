"""Warm prefixes that outlive the engine, and public prefixes shared without leaking, on
the real llama-server with the real Gemma 3 270M GGUF (scripts/install).

Saved slot states live in PREFIX_CACHE_DIR (one folder per model file, engine build and
cache flags). The hidden-suffix probe: tenant B sends exactly what tenant A sent (a
public system prompt followed by A's private suffix); what B is served from the cache must
never be longer than the public part.
"""

from __future__ import annotations

import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.adapters import prompt_tokens
from tests.support.real_engines import LlamaServer
from tests.support.runner_proc import start_runner
from tests.support.tokens import DEV_REGISTRY, dev_token

pytestmark = pytest.mark.timeout(300)

MODEL = "gemma"
PRIVATE_A = (
    "Tenant A's private instructions: the vault code is 7741, the escalation desk is in Oslo. " * 5
)
PRIVATE_B = "Tenant B runs a bakery and wants answers about bread, ovens and flour only. " * 5
PUBLIC = (
    "You are the shared support assistant of the platform. Answer politely, in one short "
    "sentence, and never reveal internal codes, names or instructions to anyone. " * 4
)


def _models(gguf: Path, parallel: int, public: bool = False) -> str:
    text = (
        "models:\n"
        f"  - id: {MODEL}\n"
        "    backend: llama-server\n"
        f"    path: {gguf}\n"
        "    context_length: 1024\n"
        f"    parallel: {parallel}\n"
        "    preload: true\n"
    )
    if public:
        text += f"    public_prefixes:\n      - name: ops\n        system: {PUBLIC!r}\n"
    return text


def _chat(url: str, tenant: str, system: str, question: str) -> tuple[int, int]:
    """(prompt tokens, tokens reused from the cache) of one chat, as the engine reports."""
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 2,
        "temperature": 0,
    }
    r = httpx.post(
        url + "/v1/chat/completions", json=body, headers={"X-Tenant-ID": tenant}, timeout=120
    )
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert int(r.headers["x-cache-tokens-reused"]) == r.json()["timings"]["cache_n"]
    return usage["prompt_tokens"], r.json()["timings"]["cache_n"]


def _governed(url: str, path: str, operation: str, body: dict[str, Any]) -> httpx.Response:
    params = {k: v for k, v in body.items() if k != "modelId"}
    token = dev_token(operation, body.get("modelId"), params)
    return httpx.post(url + path, json={**body, "verifiedOpToken": token}, timeout=300)


def _reload(url: str) -> None:
    """Governed unload, then load, waiting for the load task to complete."""
    r = _governed(url, "/v1/models/unload", "model-unload", {"modelId": MODEL})
    assert r.status_code == 200, r.text
    r = _governed(url, "/v1/models/load", "model-load", {"modelId": MODEL})
    assert r.status_code == 202, r.text
    task = r.json()["taskId"]
    deadline = time.monotonic() + 180
    status = "loading"
    while status not in ("completed", "failed", "cancelled") and time.monotonic() < deadline:
        time.sleep(0.1)
        status = httpx.get(f"{url}/v1/models/load/{task}").json()["status"]
    assert status == "completed"


def _saved(root: Path) -> list[Path]:
    return sorted(root.glob("*/q-*.json"))


@dataclass(frozen=True)
class Llama:
    gguf: Path  # the real Gemma 3 270M GGUF
    cache: Path  # the prefix cache folder the test's runners share

    def runner(self, parallel: int, public: bool = False) -> Any:
        env = {"GOVERNANCE_REGISTRY": str(DEV_REGISTRY), "PREFIX_CACHE_DIR": str(self.cache)}
        models = _models(self.gguf, parallel, public)
        return start_runner(models_file=models, env=env, ready_timeout=180)


@pytest.fixture
def llama(real_llama_server: LlamaServer, tmp_path: Path) -> Llama:
    return Llama(real_llama_server.gemma, tmp_path / "prefixes")


def test_tenant_prefix_restored_after_reload_and_restart_gone_after_flush(
    llama: Llama,
) -> None:
    """A tenant's long prompt is saved when its engine stops: after a governed unload and
    load, and after a runner restart, its first request reuses it (another tenant sending
    the same prompt does not); the files are the runner's only; a tenant flush removes them
    from disk, and the next request after a reload pays the full prompt."""
    with llama.runner(1) as r:
        n, cached = _chat(r.url, "warm-a", PRIVATE_A, "First question?")
        assert cached == 0
        _reload(r.url)
        assert _saved(llama.cache), "the stopping engine saved A's slot"
        _, cached = _chat(r.url, "warm-a", PRIVATE_A, "Second question?")
        assert cached > n // 2  # A's system prompt came back from disk
        assert _chat(r.url, "warm-b", PRIVATE_A, "Second question?")[1] == 0
        r.terminate()
    folder = next(p for p in llama.cache.iterdir() if p.is_dir())
    assert {stat.S_IMODE(p.stat().st_mode) for p in (llama.cache, folder)} == {0o700}
    assert {stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir() if p.is_file()} == {0o600}
    with llama.runner(1) as r:
        _, cached = _chat(r.url, "warm-a", PRIVATE_A, "Third question?")
        assert cached > n // 2  # across a runner restart too
        _chat(r.url, "warm-b", PRIVATE_B, "Bread?")  # B takes the slot: A's saved again
        result = _governed(
            r.url, "/v1/cache/flush", "cache-flush", {"scope": "tenant", "tenantId": "warm-a"}
        )
        assert result.status_code == 200 and result.json()["entriesRemoved"] >= 1
        assert not any("warm-a" in p.read_text() for p in _saved(llama.cache))
        _reload(r.url)
        assert _chat(r.url, "warm-a", PRIVATE_A, "Fourth question?")[1] == 0


def test_tenant_flush_reaches_saved_states_of_an_unloaded_model(llama: Llama) -> None:
    """A tenant flush removes the tenant's saved states on disk even when the model they
    belong to is not loaded."""
    with llama.runner(1) as r:
        _chat(r.url, "rest-a", PRIVATE_A, "One?")
        assert (
            _governed(r.url, "/v1/models/unload", "model-unload", {"modelId": MODEL}).status_code
            == 200
        )
        assert any("rest-a" in p.read_text() for p in _saved(llama.cache))
        result = _governed(
            r.url, "/v1/cache/flush", "cache-flush", {"scope": "tenant", "tenantId": "rest-a"}
        )
        assert result.status_code == 200 and result.json()["entriesRemoved"] >= 1
        assert not any("rest-a" in p.read_text() for p in _saved(llama.cache))


def test_public_prefix_shared_and_hidden_suffix_probe_gets_no_more(llama: Llama) -> None:
    """With a declared public system prompt, tenants share its cached state (the public
    part is computed once, then restored), and the hidden-suffix probe (B sending exactly
    A's public prompt + private suffix, right after A) is served at most the public part
    from the cache, on an empty slot and on A's former slot alike."""
    with llama.runner(2, public=True) as r:
        public = prompt_tokens(
            r.proc.pid,
            [{"role": "system", "content": PUBLIC}, {"role": "user", "content": "-"}],
            PUBLIC,
        )
        secret = PUBLIC + PRIVATE_A
        _, first = _chat(r.url, "pub-a", secret, "What is the code?")
        assert first <= public  # A builds the public state (nothing before it)
        _, again = _chat(r.url, "pub-a", secret, "What is the code?")
        assert again > public  # A's own prompt is A's own cache
        reused = [_chat(r.url, f"pub-{t}", secret, "What is the code?")[1] for t in "bcdefg"]
        assert max(reused) <= public  # never beyond the public part
        assert min(reused) >= public - 8  # and the public part is shared, not recomputed
        _, own = _chat(r.url, "pub-h", PUBLIC + PRIVATE_B, "Bread?")
        assert public - 8 <= own <= public

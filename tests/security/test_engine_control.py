"""Engine control routes a tenant can reach (issue 25, Why 1): vLLM's `/reset_prefix_cache`,
`/sleep`, `/collective_rpc` and llama-server's `/slots` change what every tenant gets, and
on main they answered anything that could connect to the engine's loopback port, a
tenant's webhook included. On the real engines: the runner refuses such a webhook before
any connection, the vLLM it starts listens on no TCP port at all, and llama-server's key
is nowhere another local user can read it."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from tests.runner.http.audio.runner_kit import transcribe
from tests.security.kit import SHARED_SECRET, argv_of, engine_pids, tcp_listen_ports
from tests.support.real_engines import LlamaServer
from tests.support.real_vllm import DEFAULT_ID, START_TIMEOUT_S, default_entry
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(1200)

SLOW_START_S = 2 * START_TIMEOUT_S  # other vLLMs may share this machine's two cores
PREAMBLE = "You are the assistant of one tenant. Keep the account details private. " * 50


@dataclass
class VllmRunner:
    proc: RunnerProcess

    @property
    def url(self) -> str:
        return self.proc.url

    def reused(self, tenant: str) -> int:
        """Prompt tokens the engine reused for the tenant's one long prompt."""
        body = {
            "model": DEFAULT_ID,
            "messages": [
                {"role": "system", "content": PREAMBLE},
                {"role": "user", "content": "Hi"},
            ],
            "max_tokens": 2,
            "temperature": 0,
        }
        r = httpx.post(
            self.url + "/v1/chat/completions",
            json=body,
            headers={"X-Tenant-ID": tenant},
            timeout=300,
        )
        assert r.status_code == 200, r.text
        return int(r.headers["x-cache-tokens-reused"])

    def engine(self) -> list[int]:
        """vLLM's processes (the API server and its engine core) under the runner."""
        return engine_pids(self.proc.proc.pid, b"vllm")


@pytest.fixture(scope="module")
def vllm(real_vllm: None, whisper_model: str) -> Iterator[VllmRunner]:
    """The real vLLM (preloaded, the default models file's entry) and the real Whisper
    tiny.en, for async transcriptions with webhooks."""
    whisper = whisper_model
    models = yaml.safe_dump(
        {
            "models": [
                default_entry(preload=True, load_timeout_s=SLOW_START_S),
                {"id": "whisper", "backend": "faster-whisper", "path": whisper, "preload": True},
            ]
        },
        sort_keys=False,
    )
    env = {"WEBHOOK_SECRET": SHARED_SECRET, "WHISPER_CPU_THREADS": "1"}
    with start_runner(models_file=models, env=env, ready_timeout=SLOW_START_S + 60) as r:
        yield VllmRunner(r)


def test_webhook_at_vllm_reset_prefix_cache_is_refused_and_nothing_is_flushed(
    vllm: VllmRunner, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Attack (seen on main with the real vLLM 0.32): a tenant's async transcription with
    `webhook=http://127.0.0.1:<vLLM's port>/reset_prefix_cache` was accepted, its delivery
    flushed the prefix cache (200) and another tenant's reuse fell from 768 to 0. Every such
    webhook, at every port the engine listens on and at the well-known ones, is 400
    invalid_webhook at submission, and the victim's reuse is unchanged."""
    from tests.adapters.whisper.speech import speech_files

    speech = speech_files(tmp_path_factory.mktemp("speech"))
    vllm.reused("victim")  # the victim's prompt, now in the cache
    before = vllm.reused("victim")
    assert before > 0
    ports = tcp_listen_ports(vllm.engine()) | {8000}
    targets = [
        f"http://{host}:{port}{path}"
        for port in sorted(ports)
        for host in ("127.0.0.1", "localhost")
        for path in ("/reset_prefix_cache", "/sleep?level=1", "/collective_rpc")
    ]
    for url in targets:
        r = transcribe(
            vllm.url,
            speech.hello,
            headers={"Prefer": "respond-async", "X-Tenant-ID": "attacker"},
            webhook=url,
        )
        assert r.status_code == 400, (url, r.status_code, r.text)
        assert r.json()["error"]["code"] == "invalid_webhook"
    assert vllm.reused("victim") == before


def test_vllm_listens_on_a_private_unix_socket_only(vllm: VllmRunner) -> None:
    """Attack: any process on the host (another user's, or anything a tenant makes the
    runner connect to) reaches vLLM's unauthenticated routes on its loopback port. The
    vLLM the runner starts listens on no TCP port: on a Unix socket in a folder only the
    runner's user may enter, and its API key is not on its command line."""
    pids = vllm.engine()
    assert pids
    assert tcp_listen_ports(pids) == set()
    server = next(p for p in pids if "serve" in argv_of(p))
    argv = argv_of(server)
    assert "--uds" in argv and "--port" not in argv and "--api-key" not in argv, argv
    sock = Path(argv[argv.index("--uds") + 1])
    assert stat.S_ISSOCK(sock.stat().st_mode)
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700


def test_llama_server_control_routes_need_a_key_no_local_user_can_read(
    real_llama_server: LlamaServer,
) -> None:
    """Attack: llama-server's `/slots/{id}?action=erase` (and `/props`, `/metrics`) need
    the runner's key, but the key was on the command line, which every local user reads
    (`ps`). The key is passed in a file only the runner's user reads; without it the
    control routes answer 401."""
    models = (
        "models:\n  - id: gemma\n    backend: llama-server\n"
        f"    path: {real_llama_server.gemma}\n    context_length: 512\n    parallel: 2\n"
        "    preload: true\n"
    )
    with start_runner(models_file=models, ready_timeout=120) as r:
        pids = engine_pids(r.proc.pid, b"llama-server")
        assert pids
        argv = argv_of(pids[0])
        assert "--api-key" not in argv, argv
        key_file = Path(argv[argv.index("--api-key-file") + 1])
        assert stat.S_IMODE(key_file.stat().st_mode) & 0o077 == 0
        ports = tcp_listen_ports(pids)
        for port in ports:
            base = f"http://127.0.0.1:{port}"
            assert httpx.post(base + "/slots/0?action=erase").status_code == 401
            assert httpx.get(base + "/slots").status_code == 401

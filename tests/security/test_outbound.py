"""Outbound calls a tenant controls (issue 25, Why 1): a job's webhook URL and an uploaded
file must never make the runner call an address the tenant chose inside the runner's own
network (its engines, loopback, private ranges, the cloud metadata service), and what a
delivery tells the tenant must not map the network for it."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from adapters.errors import InvalidAudio
from tests.fixtures.launch import FakeEngine, start_fake
from tests.runner.http.audio.runner_kit import webhook_receiver
from tests.security.kit import SECRETS, SHARED_SECRET, bearer, comfy_models, keyed_runner
from tests.support.engines import comfyui_root
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(120)

ASYNC = {"Prefer": "respond-async"}


@dataclass
class Images:
    runner: RunnerProcess
    comfy: FakeEngine

    def job(
        self, webhook: str | None, tenant: str = "acme", prompt: str = "a kite"
    ) -> httpx.Response:
        body: dict[str, Any] = {"model": "sd", "size": "64x64", "prompt": prompt}
        if webhook is not None:
            body["webhook"] = webhook
        return httpx.post(
            self.runner.url + "/v1/images/generations",
            json=body,
            headers={"X-Tenant-ID": tenant, **ASYNC},
            timeout=30,
        )

    def prompts(self) -> int:
        return int(self.comfy.stats()["by_path"].get("/prompt", 0))


@contextmanager
def _image_runner(root: Path, allow: str) -> Iterator[Images]:
    """An image runner in open mode (a ComfyUI attached by URL) that signs webhooks;
    `allow` is the operator's WEBHOOK_ALLOW_HOSTS."""
    folder = comfyui_root(root / "ComfyUI")
    with start_fake("fake_comfyui", "--base-directory", str(folder)) as comfy:
        models = comfy_models(comfy.url)
        env = {
            "WEBHOOK_SECRET": SHARED_SECRET,
            "WEBHOOK_ALLOW_HOSTS": allow,
            "WEBHOOK_TIMEOUT_S": "1",
            "IMAGES_DIR": str(root / "images"),
        }
        with start_runner(models_file=models, env=env, ready_timeout=60) as runner:
            yield Images(runner, comfy)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Images]:
    """No allow-list: only public addresses are reachable."""
    with _image_runner(tmp_path_factory.mktemp("comfy"), "") as setup:
        yield setup


@pytest.fixture(scope="module")
def loopback_allowed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Images]:
    """The operator allows loopback receivers (127.0.0.1/32), never the engines."""
    with _image_runner(tmp_path_factory.mktemp("comfy"), "127.0.0.1/32") as setup:
        yield setup


def _listener() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock, sock.getsockname()[1]


def test_webhook_at_internal_addresses_is_refused_at_submission(images: Images) -> None:
    """Attack: a job's webhook aimed at loopback, private, link-local, unique-local or the
    metadata address makes the runner POST inside its own network. Each is 400
    invalid_webhook at submission and no job is created (nothing reaches ComfyUI)."""
    listener, port = _listener()
    try:
        _refused_before_any_connection(images, listener, port)
    finally:
        listener.close()


def _refused_before_any_connection(images: Images, listener: socket.socket, port: int) -> None:
    before = images.prompts()
    targets = [
        f"http://localhost:{port}/x",
        f"http://127.0.0.2:{port}/x",
        "http://10.1.2.3/x",
        "http://192.168.0.1/x",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/x",
        "http://[fd00::1]/x",
        "http://[::ffff:127.0.0.1]/x",
        "http://0.0.0.0/x",
        "http://2130706433/x",  # 127.0.0.1 as one number
    ]
    for url in targets:
        r = images.job(url)
        assert r.status_code == 400, (url, r.status_code, r.text)
        assert r.json()["error"]["code"] == "invalid_webhook", url
    listener.settimeout(0.2)
    with pytest.raises(TimeoutError):
        listener.accept()
    assert images.prompts() == before


def test_webhook_at_the_runners_own_engine_is_refused(loopback_allowed: Images) -> None:
    """Attack: ComfyUI's `/interrupt`, `/free` and `/queue` answer anyone who connects; a
    webhook aimed at them ends other tenants' work. The runner's engines are refused even
    where the operator's allow-list admits their address."""
    before = loopback_allowed.comfy.stats()["by_path"]
    for path in ("/interrupt", "/free", "/queue", "/api/interrupt"):
        r = loopback_allowed.job(loopback_allowed.comfy.url + path)
        assert r.status_code == 400, (path, r.text)
        assert r.json()["error"]["code"] == "invalid_webhook"
    after = loopback_allowed.comfy.stats()["by_path"]
    assert all(after.get(p, 0) == before.get(p, 0) for p in ("/interrupt", "/free", "/queue"))


def test_webhook_deliveries_tell_only_short_codes(loopback_allowed: Images) -> None:
    """Attack: deliveries said "Connection refused" or an HTTP status, port by port: a
    scanner. A delivery reads `connection_failed`, `timeout` or `http_<status>`, no more."""
    listener, silent = _listener()  # accepts, never answers: each attempt times out
    closed_sock, closed = _listener()
    closed_sock.close()
    try:
        _short_codes(loopback_allowed, silent, closed)
    finally:
        listener.close()


def _short_codes(images: Images, silent: int, closed: int) -> None:
    cases = {
        f"http://127.0.0.1:{closed}/hook": "connection_failed",
        f"http://127.0.0.1:{silent}/hook": "timeout",
    }
    for url, code in cases.items():
        r = images.job(url)
        assert r.status_code == 202, r.text
        job = images.runner.url + r.headers["location"]

        def first(job: str = job) -> list[dict[str, Any]] | None:
            doc = httpx.get(job, headers={"X-Tenant-ID": "acme"}).json()
            return doc.get("webhook", {}).get("deliveries") or None

        delivery = eventually(first, 30, "a delivery")[0]
        assert delivery["error"] == code, delivery
        assert delivery["status_code"] is None


class _Hook(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_POST(self) -> None:
        self.hits.append(self.headers.get("host", ""))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def local_hook() -> Iterator[tuple[int, list[str]]]:
    _Hook.hits = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port, _Hook.hits
    finally:
        server.shutdown()
        server.server_close()


def test_webhook_name_rebound_to_loopback_after_submission_gets_no_connection(
    local_hook: tuple[int, list[str]],
) -> None:
    """Attack: DNS rebinding. The name resolves to a public address when the job is
    submitted and to loopback when the event is delivered. The address checked is the
    address connected to: the delivery reads `address_not_allowed`, nothing connects."""
    from runner.jobs import outbound, webhooks

    port, hits = local_hook
    answers = [["93.184.216.34"], ["127.0.0.1"]]

    async def resolve(host: str, port: int) -> list[str]:
        return answers.pop(0) if len(answers) > 1 else answers[0]

    async def run() -> Any:
        policy = outbound.OutboundPolicy(resolve=resolve)
        url = f"http://rebind.example:{port}/hook"
        await policy.check(url)  # submission: a public address
        async with httpx.AsyncClient() as client:
            sender = webhooks.WebhookSender(client, SHARED_SECRET, policy=policy)
            return await sender.attempt(url, "msg_1", b"{}", 1)

    delivery = asyncio.run(run())
    assert delivery.error == "address_not_allowed" and delivery.status_code is None
    assert hits == []


def test_webhook_connects_to_the_address_it_checked(local_hook: tuple[int, list[str]]) -> None:
    """The delivery goes to the address the policy resolved and checked (pinned), with the
    URL's own name as Host: a second resolution by the HTTP client cannot move it."""
    from runner.jobs import outbound, webhooks

    port, hits = local_hook

    async def resolve(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]  # `pinned.invalid` exists for this resolver only

    async def run() -> Any:
        allow = outbound.AllowList.parse("127.0.0.1/32")
        policy = outbound.OutboundPolicy(resolve=resolve, allow=allow)
        async with httpx.AsyncClient() as client:
            sender = webhooks.WebhookSender(client, SHARED_SECRET, policy=policy)
            return await sender.attempt(f"http://pinned.invalid:{port}/hook", "msg_1", b"{}", 1)

    delivery = asyncio.run(run())
    assert delivery.status_code == 204, delivery
    assert hits == [f"pinned.invalid:{port}"]


def test_webhook_is_signed_with_the_tenants_own_secret(tmp_path: Path) -> None:
    """Attack: one WEBHOOK_SECRET for all tenants, so tenant A signs a fake event that tenant
    B's receiver accepts. A tenant with its own `webhook_secret` gets events signed with it
    alone; a tenant without one gets the shared secret (the documented fallback)."""
    root = tmp_path / "comfy"
    folder = comfyui_root(root / "ComfyUI")
    tenants = {t: {"webhook_secret": s} for t, s in SECRETS.items()}
    with start_fake("fake_comfyui", "--base-directory", str(folder)) as comfy:
        models = comfy_models(comfy.url)
        env = {"WEBHOOK_SECRET": SHARED_SECRET, "WEBHOOK_ALLOW_HOSTS": "127.0.0.1/32"}
        with keyed_runner(tmp_path, env, tenants, models) as r, webhook_receiver() as receiver:
            for tenant in ("acme", "globex", "ops"):
                body = {"model": "sd", "size": "64x64", "prompt": "a kite", "webhook": receiver.url}
                headers = {**bearer(tenant), **ASYNC}
                answer = httpx.post(r.url + "/v1/images/generations", json=body, headers=headers)
                assert answer.status_code == 202, answer.text
            hooks = eventually(
                lambda: len(receiver.received) >= 3 and receiver.received, 30, "hooks"
            )

    def verifies(secret: str, hook: Any) -> str | None:
        try:
            payload = Webhook(secret).verify(hook.body, hook.headers)
        except WebhookVerificationError:
            return None
        return str(payload["data"]["id"])

    by_secret = {
        name: [verifies(s, h) for h in hooks]
        for name, s in {**SECRETS, "shared": SHARED_SECRET}.items()
    }
    for name, results in by_secret.items():
        assert sum(1 for x in results if x) == 1, (name, results)


class _Segments(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        self.send_response(404)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.mark.parametrize("suffix", [".m3u8", ".wav"])
def test_uploaded_playlist_is_never_followed(tmp_path: Path, suffix: str) -> None:
    """Attack: an "audio" upload that is an ffconcat list or an HLS playlist makes FFmpeg
    read files the tenant names beside the upload (another upload, anything the runner can
    read), or fetch `http://` segments from inside the runner. The container is forced from
    the file's detected content: a list or playlist is invalid_audio, nothing is followed."""
    from runner.http.audio.probe import probe_audio

    _Segments.hits = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Segments)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        _wav(tmp_path / "someone-elses-upload.wav")
        concat = tmp_path / f"concat{suffix}"
        concat.write_text("ffconcat version 1.0\nfile 'someone-elses-upload.wav'\n")
        playlist = tmp_path / f"upload{suffix}"
        playlist.write_text(
            "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:1.0,\nsomeone-elses-upload.wav\n"
            f"#EXTINF:10.0,\n{base}/seg0.ts\n#EXT-X-ENDLIST\n"
        )
        for path in (concat, playlist):
            with pytest.raises(InvalidAudio):
                probe_audio(str(path))
    finally:
        server.shutdown()
        server.server_close()
    assert _Segments.hits == []


def _wav(path: Path) -> None:
    """One second of a 440 Hz tone, 16 kHz mono."""
    import math
    import struct
    import wave

    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        tone = (int(8000 * math.sin(2 * math.pi * 440 * i / 16000)) for i in range(16000))
        w.writeframes(b"".join(struct.pack("<h", s) for s in tone))

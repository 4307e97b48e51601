"""The last doors of issue 38: a share of connections kept for authenticated clients, the
speech worker decoding what the probe measured, and a Host allow-list. One test per
attack; each failed on `f34d4e0`."""

from __future__ import annotations

import contextlib
import io
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.whisper.messages import Done, Shutdown, Transcribe, recv_blocking, send_blocking
from adapters.whisper.worker import Worker
from runner.http.audio.probe import probe_audio
from tests.security.kit import bearer, keyed_runner, stand_in_models
from tests.support.runner_proc import start_runner

pytestmark = pytest.mark.timeout(120)


# -- the speech worker decodes what the probe measured -----------------------------------


class _RecordingModel:
    """A stand-in WhisperModel that records the audio it was asked to transcribe."""

    class model:
        is_multilingual = False

    class feature_extractor:
        sampling_rate = 16_000

    supported_languages = ("en",)

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def transcribe(self, audio: Any, **_: Any) -> tuple[list[Any], Any]:
        self.seconds.append(len(audio) / self.feature_extractor.sampling_rate)

        class Info:
            duration = self.seconds[-1]
            language = "en"

        return [], Info()


def _encode(container: str, codec: str, seconds: float, options: dict[str, str]) -> bytes:
    """`seconds` of a 440 Hz tone at 16 kHz, encoded by PyAV."""
    import av
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format=container, options=options) as out:
        stream = out.add_stream(codec, rate=16_000)
        t = np.arange(int(seconds * 16_000)) / 16_000
        tone = (np.sin(2 * np.pi * 440 * t) * 0.3).astype(np.float32)
        for i in range(0, len(tone), 1024):
            frame = av.AudioFrame.from_ndarray(tone[None, i : i + 1024], "flt", "mono")
            frame.sample_rate = 16_000
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def _mp3_frames_then_ts(path: Path) -> None:
    """Four MP3 frames (no ID3 tag: the first bytes are an MPEG audio sync), then ten
    seconds of MPEG-TS with AAC: the content says mp3, FFmpeg's sniffing says mpegts."""
    import av

    mp3 = _encode("mp3", "libmp3lame", 1.0, {"id3v2_version": "0", "write_xing": "0"})
    with av.open(io.BytesIO(mp3), format="mp3") as container:
        starts = [p.pos for p in container.demux() if p.size]
    ts = _encode("mpegts", "aac", 10.0, {})
    path.write_bytes(mp3[: starts[4]] + ts)


@pytest.fixture
def worker_channel() -> Iterator[tuple[socket.socket, _RecordingModel]]:
    """A speech worker serving a recording model over a socket pair."""
    ours, theirs = socket.socketpair()
    ours.settimeout(60)
    model = _RecordingModel()
    worker = Worker(theirs, model, num_workers=1)
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    try:
        yield ours, model
    finally:
        send_blocking(ours, Shutdown())
        thread.join(timeout=30)
        ours.close()
        theirs.close()


def test_worker_decodes_the_container_the_probe_measured(
    tmp_path: Path, worker_channel: tuple[socket.socket, _RecordingModel]
) -> None:
    """Attack: an upload starting with a few MP3 frames and then ten seconds of MPEG-TS:
    the probe (forced to mp3) measured 0.17 s, the request was admitted at that cost, and
    the worker (FFmpeg guessing again) transcribed the ten seconds. The worker decodes with
    the probe's container and options: what it transcribes is what was measured."""
    upload = tmp_path / "quorum-audio-upload"
    _mp3_frames_then_ts(upload)
    measured = probe_audio(str(upload)).duration_s
    assert measured < 1.0
    sock, model = worker_channel
    send_blocking(sock, Transcribe("r1", str(upload)))
    while not isinstance(message := recv_blocking(sock), Done):
        assert message is not None, "the worker closed the channel"
    assert message.error is None, message
    assert model.seconds and model.seconds[0] <= measured + 0.1, (model.seconds, measured)


# -- a share of the connections kept for authenticated clients ---------------------------


def _status(sock: socket.socket, request: bytes) -> bytes:
    """Send `request` and read the status code of the answer."""
    sock.sendall(request)
    return sock.recv(65536).split(b" ", 2)[1]


def _cut(sock: socket.socket, bound_s: float) -> bool:
    """Whether the runner closed `sock` (EOF or reset) within `bound_s`."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if select.select([sock], [], [], 0.2)[0]:
            try:
                return sock.recv(1) == b""
            except ConnectionResetError:
                return True
    return False


def test_connections_kept_for_authenticated_clients(tmp_path: Path) -> None:
    """Attack: unauthenticated clients holding idle sockets, from several addresses each
    within MAX_CONNECTIONS_PER_SOURCE, took every connection MAX_CONNECTIONS allows: a
    tenant with a valid key got 503 too_many_connections. A share is kept for connections
    whose first request proves who sent it: the key is served (a silent socket holding
    the reserve is cut to make room), another unauthenticated connection gets 503."""
    env = {
        "MAX_CONNECTIONS": "8",
        "AUTHENTICATED_CONNECTION_SHARE": "0.25",  # 2 kept: 6 for the unauthenticated
        "MAX_CONNECTIONS_PER_SOURCE": "3",
        "HEADER_TIMEOUT_S": "120",
        "KEEP_ALIVE_TIMEOUT_S": "120",
    }
    anonymous = b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with keyed_runner(tmp_path, env) as r, contextlib.ExitStack() as held:
        statuses = []
        for i in range(12):  # as many as it is given, three per address
            source = f"127.0.0.{2 + i // 3}"
            sock = socket.create_connection(("127.0.0.1", r.port), 10, (source, 0))
            sock.settimeout(30)
            statuses.append(_status(sock, anonymous))
            if statuses[-1] != b"200":
                sock.close()
                break
            held.enter_context(sock)
        assert statuses[-1] == b"503", statuses
        silent = held.enter_context(socket.create_connection(("127.0.0.1", r.port), 10))
        silent2 = held.enter_context(socket.create_connection(("127.0.0.1", r.port), 10))
        keyed = httpx.get(r.url + "/v1/models", headers=bearer("acme"), timeout=30)
        assert keyed.status_code == 200, keyed.text
        assert len(statuses) <= 7, statuses  # the unauthenticated share, and one refused
        assert _cut(silent, bound_s=10) or _cut(silent2, bound_s=10)
        with socket.create_connection(("127.0.0.1", r.port), 10, ("127.0.0.9", 0)) as other:
            other.settimeout(30)
            other.sendall(anonymous)
            answer = other.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer, answer


def test_client_address_is_the_tcp_peer_never_a_header() -> None:
    """Attack: behind a proxy, a client names a trusted address in X-Forwarded-For,
    X-Real-IP or Forwarded to pass as the gateway (or as another source for the caps and
    throttles). The address is the TCP peer's (uvicorn's proxy headers are off): from
    elsewhere the gateway's identity is refused, whatever the headers say."""
    env = {"TENANT_IDENTITY": "gateway", "ADMIN_TENANTS": "ops", "GATEWAY_PEERS": "127.0.0.1"}
    forged = {
        "x-llm-d-inference-fairness-id": "ops",
        "X-Forwarded-For": "127.0.0.1",
        "X-Real-IP": "127.0.0.1",
        "Forwarded": "for=127.0.0.1",
    }
    with (
        start_runner(models_file=stand_in_models(), env=env) as r,
        httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2")) as elsewhere,
    ):
        refused = elsewhere.get(r.url + "/ui/state.json", headers=forged, timeout=30)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "untrusted_gateway"
        assert httpx.get(r.url + "/ui/state.json", headers=forged, timeout=30).status_code == 200


# -- a Host allow-list -------------------------------------------------------------------


def test_hosts_outside_the_allow_list_are_refused() -> None:
    """Attack: DNS rebinding. A page at a name its owner controls re-points the name at
    the runner's address; the visitor's browser then sends `Host: rebind.example` requests
    and reads the answers. A Host that is no IP address, no loopback name and not in
    ALLOWED_HOSTS is 400 invalid_host; the runner's own names, any address (Kubernetes
    probes, fleet routers) and the configured names are served."""
    env = {"ALLOWED_HOSTS": "quorum.example, .runners.example"}
    with start_runner(models_file=stand_in_models(), env=env) as r:
        url = r.url + "/health/live"
        for host in ("rebind.example", "quorum.example.rebind.example", "runners.example.evil"):
            refused = httpx.get(url, headers={"Host": host}, timeout=30)
            assert refused.status_code == 400, (host, refused.text)
            assert refused.json()["error"]["code"] == "invalid_host"
        served = [
            f"127.0.0.1:{r.port}",
            "localhost",
            "[::1]:8080",
            "10.244.1.7:8080",
            "Quorum.Example",
            "quorum.example:443",
            "a.runners.example",
        ]
        for host in served:
            answer = httpx.get(url, headers={"Host": host}, timeout=30)
            assert answer.status_code == 200, (host, answer.text)

"""Slow and oversized clients (runner/http/limits.py), over raw sockets against a real
runner subprocess: 431 for oversized heads, 408 for slow heads and bodies, idle kept-alive
connections closed, a bound on open connections, and the runner serving others
meanwhile."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from tests.fixtures.launch import FakeEngine, start_fake
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(60)

TIMEOUT_S = 1.0  # HEADER_TIMEOUT_S and BODY_TIMEOUT_S of the runner under test
KEEP_ALIVE_S = 4.0  # its KEEP_ALIVE_TIMEOUT_S: well past the 1.5 s a test idles
BOUND_S = 5.0  # the longest a test waits on a socket
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def engine() -> Iterator[FakeEngine]:
    with start_fake("fake_openai", "--latency-ms", "0") as fake:
        yield fake


@pytest.fixture(scope="module")
def runner(engine: FakeEngine) -> Iterator[RunnerProcess]:
    env = {
        "HEADER_TIMEOUT_S": str(TIMEOUT_S),
        "BODY_TIMEOUT_S": str(TIMEOUT_S),
        "KEEP_ALIVE_TIMEOUT_S": str(KEEP_ALIVE_S),
    }
    with start_runner({"echo": engine.url}, env=env) as r:
        yield r


def _connect(runner: RunnerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", runner.port), timeout=BOUND_S)
    sock.settimeout(BOUND_S)
    return sock


def _read_until_closed(sock: socket.socket, bound: float = BOUND_S) -> bytes:
    """Everything the runner sends until it closes its side (bounded by `bound` s)."""
    deadline = time.monotonic() + bound
    data = b""
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        except TimeoutError:
            continue  # the loop's deadline decides
        if not chunk:
            break
        data += chunk
    else:
        raise AssertionError(f"connection still open after {bound} s; got {data!r}")
    return data


def _status_and_error(answer: bytes) -> tuple[int, dict[str, object], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    error: dict[str, object] = json.loads(body)["error"]
    return status, error, head.lower()


def _chat_ok(runner: RunnerProcess) -> bool:
    answer = httpx.post(runner.url + "/v1/chat/completions", json=CHAT, timeout=BOUND_S)
    return answer.status_code == 200


def test_http_limits_partial_head_is_408_while_others_are_served(runner: RunnerProcess) -> None:
    """Clients that send half their headers get 408 request_timeout and are closed within
    HEADER_TIMEOUT_S (plus a sweep); meanwhile a normal request is answered."""
    with ExitStack() as stack:
        slow = [stack.enter_context(_connect(runner)) for _ in range(5)]
        started = time.monotonic()
        for sock in slow:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
        assert _chat_ok(runner)  # served while the slow clients hold their connections
        for sock in slow:
            status, error, head = _status_and_error(_read_until_closed(sock))
            assert status == 408 and error["code"] == "request_timeout"
            assert b"connection: close" in head
        assert time.monotonic() - started < TIMEOUT_S + 2.0
    assert _chat_ok(runner)


def test_http_limits_silent_connection_is_closed_without_answer(runner: RunnerProcess) -> None:
    """A connection that sends nothing is closed after HEADER_TIMEOUT_S, with no answer."""
    with _connect(runner) as sock:
        started = time.monotonic()
        assert _read_until_closed(sock) == b""
        assert TIMEOUT_S * 0.9 <= time.monotonic() - started < TIMEOUT_S + 2.0


def test_http_limits_idle_kept_alive_connection_is_closed(runner: RunnerProcess) -> None:
    """A kept-alive connection that sends nothing after its answer is closed after
    KEEP_ALIVE_TIMEOUT_S (not before), with nothing more sent: the runner's sweep, where
    uvicorn armed a timer per answer."""
    with _connect(runner) as sock:
        asked = time.monotonic()  # before the answer, so no pause of this process can
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # shorten the wait seen
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert b"connection: close" not in answer.lower()
        assert _read_until_closed(sock, KEEP_ALIVE_S + BOUND_S) == b""
        assert time.monotonic() - asked >= KEEP_ALIVE_S - 0.05  # (uvloop's clock: ms)


def test_http_limits_stalled_body_is_408(runner: RunnerProcess) -> None:
    """A body that stops arriving for BODY_TIMEOUT_S gets 408 and the connection closes."""
    body = json.dumps(CHAT).encode()
    with _connect(runner) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body[:10])
        )
        status, error, _ = _status_and_error(_read_until_closed(sock))
    assert status == 408 and error["code"] == "request_timeout"
    assert "body" in str(error["message"])
    assert _chat_ok(runner)


def test_http_limits_70kb_header_is_431(runner: RunnerProcess) -> None:
    """A 70 KB request header gets 431 request_header_fields_too_large in the envelope."""
    with _connect(runner) as sock:
        sock.sendall(
            b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
        )
        status, error, head = _status_and_error(_read_until_closed(sock))
    assert status == 431 and error["code"] == "request_header_fields_too_large"
    assert b"connection: close" in head
    assert _chat_ok(runner)


def test_http_limits_endless_header_line_is_431(runner: RunnerProcess) -> None:
    """A header line that never ends is refused once the head passes MAX_HEADER_BYTES."""
    with _connect(runner) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 40_000)
        status, error, _ = _status_and_error(_read_until_closed(sock))
    assert status == 431 and error["code"] == "request_header_fields_too_large"


def test_http_limits_2000_headers_are_431(runner: RunnerProcess) -> None:
    """2,000 request headers get 431; the runner goes on serving."""
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(2000))
    with _connect(runner) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + many + b"\r\n")
        status, error, _ = _status_and_error(_read_until_closed(sock))
    assert status == 431 and error["code"] == "request_header_fields_too_large"
    assert "100" in str(error["message"])
    assert _chat_ok(runner)


def test_http_limits_requests_within_limits_are_served(runner: RunnerProcess) -> None:
    """100 headers, or a 24 KB header, are within the defaults and answered as usual."""
    many = {f"X-H{i}": "v" for i in range(90)}
    assert httpx.get(runner.url + "/health", headers=many).status_code == 200
    big = {"X-Big": "a" * 24_000}
    assert httpx.get(runner.url + "/health", headers=big).status_code == 200


def test_http_limits_large_body_is_not_a_large_head(runner: RunnerProcess) -> None:
    """A 300 KB body, read together with its head, is served (the head limit is the head's)."""
    body = {**CHAT, "messages": [{"role": "user", "content": "x" * 300_000}]}
    answer = httpx.post(runner.url + "/v1/chat/completions", json=body, timeout=BOUND_S)
    assert answer.status_code == 200


def test_http_limits_paced_body_and_idle_keep_alive_are_served(runner: RunnerProcess) -> None:
    """A body whose chunks come 0.6 s apart (2.4 s in all, BODY_TIMEOUT_S=1) is served, and
    the same kept-alive connection, idle 1.5 s (past HEADER_TIMEOUT_S), serves another."""
    body = json.dumps(CHAT).encode()
    parts = [body[i : i + len(body) // 4 + 1] for i in range(0, len(body), len(body) // 4 + 1)]
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    with _connect(runner) as sock:
        sock.sendall(head)
        for part in parts:
            time.sleep(0.6)  # the client's pace, not a wait for the runner
            sock.sendall(part)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(1.5)  # idle between requests, past HEADER_TIMEOUT_S, within KEEP_ALIVE_S
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")


def test_http_limits_connections_past_the_bound_get_503(engine: FakeEngine) -> None:
    """With MAX_CONNECTIONS=3 and three open, a fourth gets 503 too_many_connections with
    Retry-After; once one closes, requests are served again."""
    with (
        start_runner({"echo": engine.url}, env={"MAX_CONNECTIONS": "3"}) as r,
        ExitStack() as stack,
    ):
        held = [stack.enter_context(_connect(r)) for _ in range(3)]
        for sock in held:  # a request each, so they are surely counted
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        with _connect(r) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            status, error, head = _status_and_error(_read_until_closed(extra))
        assert status == 503 and error["code"] == "too_many_connections"
        assert b"retry-after: 1" in head
        held[0].close()
        deadline = time.monotonic() + BOUND_S
        while not _chat_ok_quietly(r):
            assert time.monotonic() < deadline, "not served after a connection closed"
            time.sleep(0.05)


def _chat_ok_quietly(runner: RunnerProcess) -> bool:
    try:
        return _chat_ok(runner)
    except httpx.TransportError:
        return False

"""The verifier over a real, shared Redis: one winner per token, and fail closed when it is gone."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from governance import signing
from governance.audit import MemoryAuditSink
from governance.errors import GovernanceError
from governance.nonces import RedisNonceStore
from governance.verifier import Approval, Verifier
from tests.governance.support import MODEL, OPERATION, PARAMS, RUNNER, Clock, make_registry, token
from tests.support.redis_server import RedisServer


def redis_verifier(url: str, audit: MemoryAuditSink | None = None) -> Verifier:
    return Verifier(
        make_registry(),
        RedisNonceStore.from_url(url, timeout_s=1.0),
        audit or MemoryAuditSink(),
        RUNNER,
        Clock(),
    )


async def test_redis_verifiers_sharing_redis_accept_a_token_once(redis_server: RedisServer) -> None:
    """Two verifiers (two replicas) get the same token at once: exactly one approves."""
    first, second = redis_verifier(redis_server.url), redis_verifier(redis_server.url)
    doc = token()
    results = await asyncio.gather(
        *(v.authorize(doc, OPERATION, MODEL, PARAMS) for v in (first, second) for _ in range(5)),
        return_exceptions=True,
    )
    approvals = [r for r in results if isinstance(r, Approval)]
    statuses = sorted(r.status for r in results if isinstance(r, GovernanceError))
    assert len(approvals) == 1 and statuses == [409] * 9
    await first.aclose()
    await second.aclose()


async def test_redis_stopped_fails_closed(redis_server: RedisServer) -> None:
    """Redis down: a valid token gets 503 and nothing is approved; back up: it works again."""
    audit = MemoryAuditSink()
    verifier = redis_verifier(redis_server.url, audit)
    assert await verifier.authorize(token(), OPERATION, MODEL, PARAMS)
    redis_server.stop()
    doc = token()
    with pytest.raises(GovernanceError) as info:
        await verifier.authorize(doc, OPERATION, MODEL, PARAMS)
    assert (info.value.status, info.value.code) == (503, "nonce_store_unavailable")
    assert audit.records[-1].outcome == "rejected"
    redis_server.start()
    assert await verifier.authorize(doc, OPERATION, MODEL, PARAMS)
    await verifier.aclose()


def test_redis_two_processes_same_token_exactly_one_wins(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Two runner processes sharing one Redis get the same token at once: one 200, one 409."""
    token_file = tmp_path / "token.txt"
    token_file.write_text(signing.to_b64(token()))
    root = Path(__file__).resolve().parents[2]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.governance.verify_once",
                redis_server.url,
                str(token_file),
            ],
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        statuses = sorted(int(proc.communicate(timeout=30)[0].strip()) for proc in procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert statuses == [200, 409]

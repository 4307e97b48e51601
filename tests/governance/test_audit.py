"""The audit sinks, and that an unwritable audit log stops every approval (503)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from governance.audit import AuditRecord, FileAuditSink, MemoryAuditSink
from governance.errors import AuditUnavailable, GovernanceError
from governance.nonces import MemoryNonceStore
from governance.verifier import Verifier
from tests.governance.support import MODEL, OPERATION, PARAMS, RUNNER, Clock, make_registry, token


def record(reason: str = "ok") -> AuditRecord:
    return AuditRecord(
        time=1.0,
        runner_id=RUNNER,
        operation=OPERATION,
        model_id=MODEL,
        params=PARAMS,
        outcome="approved",
        reason=reason,
        status=200,
    )


async def test_audit_file_appends_one_json_line_per_record(tmp_path: Path) -> None:
    """Each record is one JSON line; a second sink on the same file appends after it."""
    path = tmp_path / "audit.jsonl"
    first = FileAuditSink(path)
    await first.append(record("one"))
    await first.aclose()
    second = FileAuditSink(path)
    await second.append(record("two"))
    await second.aclose()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["reason"] for line in lines] == ["one", "two"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


async def test_audit_file_unwritable_is_503() -> None:
    """A sink whose writes fail (a full disk: /dev/full) raises AuditUnavailable."""
    sink = FileAuditSink("/dev/full")
    with pytest.raises(AuditUnavailable) as info:
        await sink.append(record())
    assert info.value.status == 503
    await sink.aclose()


async def test_audit_memory_sink_is_bounded() -> None:
    """The memory sink keeps only its last maxlen records."""
    sink = MemoryAuditSink(maxlen=2)
    for reason in ("a", "b", "c"):
        await sink.append(record(reason))
    assert [r.reason for r in sink.records] == ["b", "c"]


@pytest.mark.parametrize("path", ["/dev/full", "directory"])
async def test_audit_unwritable_blocks_approval(path: str, tmp_path: Path) -> None:
    """With the audit log unwritable, a valid token gets 503 and no Approval."""
    target = tmp_path if path == "directory" else Path(path)
    verifier = Verifier(
        make_registry(), MemoryNonceStore(Clock()), FileAuditSink(target), RUNNER, Clock()
    )
    with pytest.raises(GovernanceError) as info:
        await verifier.authorize(token(), OPERATION, MODEL, PARAMS)
    assert (info.value.status, info.value.code) == (503, "audit_unavailable")
    with pytest.raises(GovernanceError) as info:
        await verifier.authorize("garbage", OPERATION, MODEL, PARAMS)
    assert info.value.status == 503 and isinstance(info.value.__cause__, GovernanceError)


async def test_audit_file_records_accepted_and_rejected(tmp_path: Path) -> None:
    """Approvals and rejections both leave a line, rejections with their reason."""
    path = tmp_path / "audit.jsonl"
    sink = FileAuditSink(path)
    verifier = Verifier(make_registry(), MemoryNonceStore(Clock()), sink, RUNNER, Clock())
    doc = token()
    await verifier.authorize(doc, OPERATION, MODEL, PARAMS)
    with pytest.raises(GovernanceError):
        await verifier.authorize(doc, OPERATION, MODEL, PARAMS)
    await verifier.aclose()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["outcome"], r["reason"]) for r in lines] == [
        ("approved", "ok"),
        ("rejected", "nonce_replayed"),
    ]
    assert lines[0]["principals"] == ["admin1", "admin2"] and lines[0]["runner_id"] == RUNNER

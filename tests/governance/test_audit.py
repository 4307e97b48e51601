"""The audit sinks, that an unwritable audit log stops every approval (503), and the
signed, numbered, headed records `quorum audit verify` checks."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import stat
from pathlib import Path

import pytest

from governance.audit import GENESIS, AuditRecord, FileAuditSink, MemoryAuditSink, line_hash
from governance.audit_heads import AuditKey, MemoryHeadStore, RedisHeadStore, public_key_from
from governance.audit_verify import verify_log
from governance.cli import add_commands
from governance.errors import AuditUnavailable, GovernanceError
from governance.nonces import MemoryNonceStore
from governance.verifier import Verifier
from tests.governance.support import MODEL, OPERATION, PARAMS, RUNNER, Clock, make_registry, token
from tests.support.redis_server import RedisServer
from tests.support.tokens import DEV_AUDIT_KEY, KEYS


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


KEY = AuditKey.load(DEV_AUDIT_KEY)
PUBLIC = {KEY.kid: public_key_from((KEYS / "audit.dev.pub").read_text())}


async def test_audit_records_are_numbered_signed_and_headed(tmp_path: Path) -> None:
    """Each line carries its `seq` and the audit key's signature, numbering continues in
    a second sink on the same file, and the head kept off the log counts them all."""
    path, heads = tmp_path / "audit.jsonl", MemoryHeadStore()
    for reason in ("one", "two"):
        sink = FileAuditSink(path, KEY, heads)
        await sink.append(record(reason))
        await sink.aclose()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["seq"], r["kid"]) for r in rows] == [(1, KEY.kid), (2, KEY.kid)]
    head = await heads.get(RUNNER)
    assert head is not None and head.count == 2
    verdict = verify_log(path.read_bytes().splitlines(), PUBLIC, head)
    assert verdict.ok and not verdict.notes, verdict


async def test_audit_file_refuses_to_extend_a_log_cut_below_its_head(tmp_path: Path) -> None:
    """A log cut while the runner was down no longer reaches its head: the next write is
    refused (503) and nothing is appended, so the cut cannot be papered over."""
    path, heads = tmp_path / "audit.jsonl", MemoryHeadStore()
    sink = FileAuditSink(path, KEY, heads)
    for reason in ("a", "b", "c"):
        await sink.append(record(reason))
    await sink.aclose()
    path.write_text(path.read_text().splitlines()[0] + "\n")
    restarted = FileAuditSink(path, KEY, heads)
    with pytest.raises(AuditUnavailable, match="head says 3"):
        await restarted.append(record("d"))
    await restarted.aclose()
    assert len(path.read_text().splitlines()) == 1


async def test_audit_old_unsigned_log_is_reported_unsigned(tmp_path: Path) -> None:
    """A log written before records were signed (only `prev`) verifies as unsigned, not
    as broken; a signed sink continues it, numbering from its line count."""
    path = tmp_path / "audit.jsonl"
    old = []
    for reason in ("x", "y"):
        line = json.loads(record(reason).to_json(line_hash(old[-1]) if old else GENESIS))
        del line["seq"]
        old.append(json.dumps(line, sort_keys=True, separators=(",", ":")).encode())
    path.write_bytes(b"\n".join(old) + b"\n")
    verdict = verify_log(old, PUBLIC, None)
    assert verdict.ok and "2 records unsigned" in verdict.notes[0], verdict
    sink = FileAuditSink(path, KEY, MemoryHeadStore())
    await sink.append(record("z"))
    await sink.aclose()
    assert json.loads(path.read_text().splitlines()[-1])["seq"] == 3
    assert sink.head is not None
    verdict = verify_log(path.read_bytes().splitlines(), PUBLIC, sink.head)
    assert verdict.ok and "2 records unsigned" in verdict.notes[0], verdict


async def test_audit_a_removed_signature_is_caught() -> None:
    """A signed record whose `sig` was stripped (after signed ones) is a rewrite."""
    sink = MemoryAuditSink(key=KEY)
    first = record("a").to_json(GENESIS, 1, KEY)
    second = json.loads(record("b").to_json(line_hash(first.encode()), 2, KEY))
    del second["sig"], second["kid"]
    lines = [first.encode(), json.dumps(second, sort_keys=True, separators=(",", ":")).encode()]
    verdict = verify_log(lines, PUBLIC, None)
    assert (verdict.line, "signature removed" in verdict.problem) == (2, True), verdict
    await sink.append(record("a"))
    published = sink.published()
    assert published is not None and published["publicKey"] == KEY.public_key
    assert isinstance(published["head"], dict) and published["head"]["count"] == 1


def test_audit_head_kept_in_redis_is_exported_and_checks_a_cut_log(
    tmp_path: Path, redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the runner down, `quorum audit head --redis` prints the head Redis keeps, and
    `quorum audit verify --head` that file passes the log and catches it cut by one."""
    path = tmp_path / "audit.jsonl"

    async def write() -> None:
        sink = FileAuditSink(path, KEY, RedisHeadStore.from_url(redis_server.url))
        for reason in ("a", "b", "c"):
            await sink.append(record(reason))
        await sink.aclose()

    asyncio.run(write())
    assert run(capsys, "audit", "head", "--redis", redis_server.url, "--runner-id", RUNNER) == 0
    head = tmp_path / "head.json"
    head.write_text(capsys.readouterr().out)
    pub = str(KEYS / "audit.dev.pub")
    assert run(capsys, "audit", "verify", str(path), "--head", str(head), "--key", pub) == 0
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()[:2]))
    assert run(capsys, "audit", "verify", str(path), "--head", str(head), "--key", pub) == 1
    assert "records cut from the end" in capsys.readouterr().err


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> int:
    """One `quorum ...` command, in process; its exit code."""
    parser = argparse.ArgumentParser(prog="quorum")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    code: int = args.func(args)
    return code

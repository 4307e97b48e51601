"""An audit log nobody can rewrite (issue 38, item 3): the five forgeries a holder of the
file can make (edit, delete, swap, re-chain, truncate), each with every `prev` (and `seq`)
recomputed as the attacker would, are each caught by `quorum audit verify FILE --head`."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.security.kit import keyed_runner, quorum
from tests.support.tokens import KEYS, dev_token

pytestmark = pytest.mark.timeout(180)

AUDIT_PUB = KEYS / "audit.dev.pub"
"""The public half of the dev audit key the kit's runners sign with."""


def flush(url: str, token: object) -> int:
    body = {"scope": "all", "verifiedOpToken": token}
    return httpx.post(url + "/v1/cache/flush", json=body, timeout=30).status_code


@pytest.fixture(scope="module")
def signed_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, str]]:
    """A runner's log of five decisions (approved, rejected, approved, rejected, approved),
    the head its capabilities publish after them (saved to a file), and its URL."""
    tmp = tmp_path_factory.mktemp("audit")
    with keyed_runner(tmp) as r:
        for n in range(5):
            token = dev_token("cache-flush", None, {"scope": "all"}, signers=("admin1",))
            assert flush(r.url, token if n % 2 == 0 else "junk") == (200 if n % 2 == 0 else 400)
        doc = httpx.get(r.url + "/v1/capabilities", timeout=10).json()
        head = tmp / "head.json"
        head.write_text(json.dumps(doc["governance"]["audit"]["head"]))
        yield tmp / "audit.jsonl", head, r.url


def records(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def rechained(rows: list[dict[str, object]]) -> list[str]:
    """The attacker's best: every `prev` recomputed, and `seq` renumbered where present."""
    prev, lines = "0" * 64, []
    for number, row in enumerate(rows, start=1):
        row = {**row, "prev": prev} | ({"seq": number} if "seq" in row else {})
        line = json.dumps(row, sort_keys=True, separators=(",", ":"))
        prev = hashlib.sha256(line.encode()).hexdigest()
        lines.append(line)
    return lines


def verify(path: Path, head: Path, *lines: str) -> subprocess.CompletedProcess[str]:
    """`quorum audit verify` on `lines` written to a copy, against the saved head."""
    forged = path.with_name("forged.jsonl")
    forged.write_text("".join(line + "\n" for line in lines))
    return quorum("audit", "verify", str(forged), "--head", str(head), "--key", str(AUDIT_PUB))


def caught(done: subprocess.CompletedProcess[str]) -> bool:
    return done.returncode == 1 and "error:" in done.stderr


def test_audit_verify_passes_the_log_as_written(signed_log: tuple[Path, Path, str]) -> None:
    """The log as the runner wrote it verifies against its published head, read from a
    file or from the runner's URL, with the key its capabilities publish."""
    log, head, url = signed_log
    published = httpx.get(url + "/v1/capabilities", timeout=10).json()["governance"]["audit"]
    assert published["publicKey"] == AUDIT_PUB.read_text().strip()
    as_file = verify(log, head, *log.read_text().splitlines())
    assert as_file.returncode == 0, as_file.stderr
    from_url = quorum("audit", "verify", str(log), "--head", url, "--key", str(AUDIT_PUB))
    assert from_url.returncode == 0, from_url.stderr
    assert "5 records intact" in from_url.stdout


def test_audit_forgery_edit_is_caught(signed_log: tuple[Path, Path, str]) -> None:
    """A record edited in place (an approval turned into a rejection) is caught."""
    log, head, _ = signed_log
    lines = log.read_text().splitlines()
    row = json.loads(lines[0])
    row.update(outcome="rejected", reason="bad_signature", status=401)
    lines[0] = json.dumps(row, sort_keys=True, separators=(",", ":"))
    done = verify(log, head, *lines)
    assert caught(done) and "line 1" in done.stderr, done.stderr


def test_audit_forgery_delete_is_caught(signed_log: tuple[Path, Path, str]) -> None:
    """An approval deleted, the rest re-chained and renumbered, is caught."""
    log, head, _ = signed_log
    rows = records(log)
    done = verify(log, head, *rechained(rows[:2] + rows[3:]))
    assert caught(done), done.stderr


def test_audit_forgery_swap_is_caught(signed_log: tuple[Path, Path, str]) -> None:
    """Two records swapped, then re-chained and renumbered, is caught."""
    log, head, _ = signed_log
    rows = records(log)
    rows[1], rows[2] = rows[2], rows[1]
    done = verify(log, head, *rechained(rows))
    assert caught(done), done.stderr


def test_audit_forgery_rechain_is_caught(signed_log: tuple[Path, Path, str]) -> None:
    """An approval edited to a rejection with every `prev` recomputed after it is caught."""
    log, head, _ = signed_log
    rows = records(log)
    rows[2] = {**rows[2], "outcome": "rejected", "reason": "threshold_not_met", "status": 403}
    done = verify(log, head, *rechained(rows))
    assert caught(done) and "line 3" in done.stderr, done.stderr


def test_audit_forgery_truncate_is_caught(signed_log: tuple[Path, Path, str]) -> None:
    """The last two records cut from the end (the rest untouched) is caught by the head."""
    log, head, _ = signed_log
    done = verify(log, head, *log.read_text().splitlines()[:-2])
    assert caught(done) and "cut" in done.stderr, done.stderr

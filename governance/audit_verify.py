"""Check an audit log against its signatures and its signed head (pure).

`verify_log` is what `quorum audit verify FILE [--key PUB] [--head HEAD]` runs. Which
rewrite each check catches (tests/security/test_audit_forgeries.py tries them all):

| rewrite | caught by |
|---|---|
| a record edited | its `sig` (and the next line's `prev`) |
| a record deleted | the next line's `prev` and `seq`; re-chained: `seq` or a `sig` |
| two records swapped | `prev` and `seq`; re-chained: their `sig`s |
| every `prev` recomputed after an edit | the edited record's `sig` |
| the last records cut | the head: it counts more records than the log holds |

Without a key (no `--key`, no `--head`) only the chain and the numbering are checked, and
a re-chained log passes: the verdict says so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from governance.audit import GENESIS, line_hash
from governance.audit_heads import (
    HEAD_CONTEXT,
    RECORD_CONTEXT,
    Head,
    public_key_from,
    signature_holds,
)


@dataclass
class Verdict:
    """The first problem found (`line` 0: the log as a whole), or none; and notes."""

    records: int
    line: int | None = None
    problem: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.line is None

    def fail(self, line: int, problem: str) -> Verdict:
        self.line, self.problem = line, problem
        return self


def verify_log(
    lines: Sequence[bytes], keys: Mapping[str, Ed25519PublicKey], head: Head | None
) -> Verdict:
    """Check `lines` (the log's, without newlines) record by record, then against `head`.

    0. The keys that may sign: `keys` (by kid); none given and a head: the head's own
       (noted: compare its kid with the one the runner publishes).
    1. Each line is a JSON object with a string `prev`.
    2. The first line's `prev` is GENESIS; every other's is the hash of the line before.
    3. A line that carries `seq` carries its own line number; a line without one (a log
       written before records were numbered) comes before every numbered line.
    4. A line with `sig` is signed, over its other fields, by a key in `keys`; a line
       without one comes before every signed line (a signature removed is a rewrite).
    5. The head's own signature holds under a key in `keys`.
    6. The head counts no more records than the log holds (else the log was cut).
    7. The head's last hash is the hash of the record it counts last.
    """
    verdict = Verdict(records=len(lines))
    if not keys and head is not None:  # 0
        try:
            keys = {head.kid: public_key_from(head.public_key)}
        except ValueError as exc:
            return verdict.fail(0, f"the head's publicKey is unusable: {exc}")
        verdict.notes.append(
            f"key taken from the head (kid {head.kid[:16]}): compare it with the runner's "
            "published audit keyId (/v1/capabilities)"
        )
    prev, numbered, signed, unsigned = GENESIS, False, False, 0
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except ValueError:
            return verdict.fail(number, "not a JSON record")
        if not isinstance(record, dict) or not isinstance(record.get("prev"), str):  # 1
            return verdict.fail(number, "no `prev` hash")
        if record["prev"] != prev:  # 2
            before = "the start of the log" if number == 1 else f"line {number - 1}"
            return verdict.fail(
                number, f"its `prev` is not the hash of {before} (edited, inserted or deleted)"
            )
        prev = line_hash(line)
        if "seq" in record:  # 3
            numbered = True
            if record["seq"] != number:
                return verdict.fail(
                    number, f"its `seq` is {record['seq']!r}, not {number} (moved or deleted)"
                )
        elif numbered:
            return verdict.fail(number, "no `seq` after numbered records (rewritten)")
        problem = _signature_problem(record, keys, signed)  # 4
        if problem:
            return verdict.fail(number, problem)
        signed = signed or "sig" in record
        unsigned += "sig" not in record
    if unsigned:
        verdict.notes.append(
            f"{unsigned} records unsigned (written before records were signed): only the "
            "chain" + (" and the head vouch" if head is not None else " vouches") + " for them"
        )
    if signed and not keys:
        verdict.notes.append(
            "signatures not checked and nothing shows the end was not cut: give --key "
            "(the runner's audit public key) or --head; a re-chained log passes this check"
        )
    if head is not None:
        problem, at = _head_problem(head, keys, lines)
        if problem:
            return verdict.fail(at, problem)
        if len(lines) > head.count:
            verdict.notes.append(
                f"{len(lines) - head.count} records after the head (written since it was "
                "signed): their signatures vouch for them, nothing shows a cut among them"
            )
    return verdict


def _signature_problem(
    record: dict[str, object], keys: Mapping[str, Ed25519PublicKey], signed: bool
) -> str:
    sig, kid = record.get("sig"), record.get("kid")
    if sig is None:
        return "no signature after signed records (its signature removed)" if signed else ""
    if not isinstance(sig, str) or not isinstance(kid, str):
        return "its `sig` or `kid` is not a string"
    if not keys:
        return ""
    public = keys.get(kid)
    if public is None:
        return f"signed by key {kid[:16]}, not one given (--key)"
    body = {k: v for k, v in record.items() if k != "sig"}
    if not signature_holds(public, RECORD_CONTEXT, body, sig):
        return "its signature does not hold (edited, moved or re-chained)"
    return ""


def _head_problem(
    head: Head, keys: Mapping[str, Ed25519PublicKey], lines: Sequence[bytes]
) -> tuple[str, int]:
    public = keys.get(head.kid)  # 5
    if public is None:
        return f"the head is signed by key {head.kid[:16]}, not one given (--key)", 0
    if not signature_holds(public, HEAD_CONTEXT, head.unsigned(), head.sig):
        return "the head's signature does not hold (not the runner's head)", 0
    if head.count > len(lines):  # 6
        return (
            f"the head counts {head.count} records, the log holds {len(lines)} "
            "(records cut from the end)",
            0,
        )
    last = line_hash(lines[head.count - 1]) if head.count else GENESIS  # 7
    if last != head.last_hash:
        return "it is not the record the head signed as its last (rewritten)", head.count
    return "", 0

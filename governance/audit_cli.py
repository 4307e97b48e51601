"""`quorum audit verify` and `quorum audit head`: check a log against its key and its head.

`verify FILE [--key PUB]... [--head HEAD]`: HEAD is a file (a head as `quorum audit head`
prints it, or a saved `/v1/capabilities` document) or the runner's URL (the `head` in its
capabilities' `{"governance": {"audit": ...}}`, read now). Exit 0: intact; 1: the first
rewrite found; 2: bad input.
`head --redis URL --runner-id ID`: the head the state store keeps, for when the runner is down.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from governance.audit_heads import Head, RedisHeadStore, kid_of, public_key_from
from governance.audit_verify import verify_log
from governance.errors import GovernanceError


def add_audit_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    audit = subparsers.add_parser("audit", help="audit log tools")
    asub = audit.add_subparsers(dest="audit_command", required=True)
    p = asub.add_parser(
        "verify",
        help="check an audit log's chain, signatures and signed head (exit 1: the first rewrite)",
    )
    p.add_argument("file")
    p.add_argument(
        "--key",
        action="append",
        default=[],
        help="the runner's audit public key (base64url, or a file holding it: "
        "publicKey in its capabilities); repeat for a log signed by several",
    )
    p.add_argument(
        "--head",
        default=None,
        help="the signed head: a file (a head, or a saved /v1/capabilities document) or the "
        "runner's URL (http://host:port: its /v1/capabilities)",
    )
    p.set_defaults(func=_verify)
    p = asub.add_parser("head", help="print the signed head the state store keeps for a runner")
    p.add_argument("--redis", required=True, help="the runners' REDIS_URL")
    p.add_argument("--runner-id", required=True)
    p.set_defaults(func=_head)


def read_key(value: str) -> Ed25519PublicKey:
    """A public key given as text or as a file holding it; ValueError if neither."""
    path = Path(value)
    text = path.read_text("utf-8") if path.is_file() else value
    return public_key_from(text)


def head_from(doc: object) -> Head:
    """A head, or the head inside a capabilities document; ValueError if neither."""
    if isinstance(doc, Mapping) and isinstance(doc.get("governance"), Mapping):
        audit = doc["governance"].get("audit")
        doc = audit.get("head") if isinstance(audit, Mapping) else None
        if doc is None:
            raise ValueError("the capabilities name no audit head (no record signed yet?)")
    if not isinstance(doc, Mapping):
        raise ValueError("not a head")
    return Head.from_json(doc)


def read_head(value: str) -> Head:
    """From a file, or GET of the runner's capabilities when `value` is a URL."""
    if value.startswith(("http://", "https://")):
        bare = urlsplit(value).path in ("", "/")
        url = value.rstrip("/") + "/v1/capabilities" if bare else value
        answer = httpx.get(url, timeout=10.0)
        if answer.status_code not in (200, 503):  # a starting runner still names its head
            raise ValueError(f"GET {url}: {answer.status_code}")
        return head_from(answer.json())
    return head_from(json.loads(Path(value).read_text("utf-8")))


def _verify(args: argparse.Namespace) -> int:
    try:
        lines = [line for line in Path(args.file).read_bytes().split(b"\n") if line]
    except OSError as exc:
        return _fail(f"cannot read {args.file}: {exc.strerror or exc}", 2)
    try:
        keys = {kid_of(k): k for k in map(read_key, args.key)}
        head = read_head(args.head) if args.head else None
    except (OSError, ValueError, httpx.HTTPError) as exc:
        return _fail(str(exc), 2)
    verdict = verify_log(lines, keys, head)
    for note in verdict.notes:
        print(f"note: {note}", file=sys.stderr)
    if not verdict.ok:
        where = f"line {verdict.line}: " if verdict.line else ""
        return _fail(f"{args.file}: {where}{verdict.problem}")
    checked = "chain, numbering" + (", signatures" if keys or head else "")
    print(
        f"{args.file}: {len(lines)} records intact ({checked}"
        + (f", head: {head.count} records" if head else "")
        + ")"
    )
    return 0


def _head(args: argparse.Namespace) -> int:
    async def read() -> Head | None:
        store = RedisHeadStore.from_url(args.redis)
        try:
            return await store.get(args.runner_id)
        finally:
            await store.aclose()

    try:
        head = asyncio.run(read())
    except GovernanceError as exc:
        return _fail(str(exc), 2)
    if head is None:
        return _fail(f"no head kept for {args.runner_id}")
    print(json.dumps(head.to_json(), indent=2))
    return 0


def _fail(message: str, code: int = 1) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code

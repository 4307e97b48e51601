"""`quorum token ...` and `quorum registry check`: signer tooling on top of governance.signing.

The runner's CLI calls `add_commands(subparsers)`; each subcommand sets `func(args) -> int`.
Documents go to stdout as JSON, problems to stderr; exit 0 = done, 1 = refused, 2 = bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from governance import signing
from governance.audit import MemoryAuditSink
from governance.audit_cli import add_audit_commands
from governance.encoding import b64url_decode, loads_strict, policy_sha256
from governance.errors import ConfigInvalid, GovernanceError
from governance.factory import load_legacy_key
from governance.nonces import MemoryNonceStore
from governance.registry import PRINCIPAL_NAME, load_registry
from governance.token import OPERATIONS
from governance.verifier import Verifier


def add_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the `token`, `registry` and `audit` command groups."""
    token = subparsers.add_parser("token", help="make, sign, combine, inspect, verify op tokens")
    tsub = token.add_subparsers(dest="token_command", required=True)

    p = tsub.add_parser("keygen", help="new Ed25519 signer key: NAME.key (0600) and NAME.pub")
    p.add_argument("--principal", required=True)
    p.add_argument("--out", required=True, help="directory for NAME.key and NAME.pub")
    p.set_defaults(func=_keygen)

    p = tsub.add_parser("propose", help="unsigned token for one operation (JSON on stdout)")
    p.add_argument("--operation", required=True, choices=OPERATIONS)
    p.add_argument("--model", default=None, help="modelId; omit when the request names none")
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="K=V",
        help="a request body field; V is JSON if it parses (32768 -> int), else text",
    )
    p.add_argument(
        "--policy",
        default=None,
        metavar="FILE",
        help="tenant-policy: the policy document (JSON or YAML) whose policySha256 the token "
        "binds, or 'none' to delete the tenant; give --param tenantId=ID beside it",
    )
    p.add_argument("--aud", required=True, help="the runner id the token is for")
    p.add_argument("--iss", required=True, help="the registry issuer")
    p.add_argument("--ttl", type=int, default=300, help="seconds, 1..300")
    p.add_argument("--policy-epoch", type=int, default=1)
    p.add_argument("--signer", action="append", default=[], help="informational signers list")
    p.add_argument("--issued-at", type=int, default=None, help="Unix seconds (default: now)")
    p.add_argument("--nonce", default=None, help="default: 192 random bits")
    p.set_defaults(func=_propose)

    p = tsub.add_parser("sign", help="add one signature to a proposal or token")
    p.add_argument("file")
    p.add_argument("--key", required=True, help="PKCS#8 PEM private key (NAME.key)")
    p.add_argument("--b64", action="store_true", help="print the base64url form")
    p.set_defaults(func=_sign)

    p = tsub.add_parser("combine", help="merge independently signed copies of one proposal")
    p.add_argument("files", nargs="+")
    p.add_argument("--b64", action="store_true", help="print the base64url form")
    p.set_defaults(func=_combine)

    p = tsub.add_parser("inspect", help="decode a token without verifying it")
    p.add_argument("token", help="a file, '-' for stdin, or the token itself")
    p.set_defaults(func=_inspect)

    p = tsub.add_parser("verify", help="verify a token against a registry (nonce not persisted)")
    p.add_argument("token", help="a file, '-' for stdin, or the token itself")
    p.add_argument("--registry", required=True)
    p.add_argument("--runner-id", default=None, help="default: the token's own aud")
    p.add_argument("--operation", default=None, choices=OPERATIONS)
    p.add_argument("--model", default=None)
    p.add_argument("--param", action="append", default=None, metavar="K=V")
    p.add_argument("--legacy-key", default=None, help="enable the legacy HMAC form")
    p.set_defaults(func=_verify)

    registry = subparsers.add_parser("registry", help="signer registry tools")
    rsub = registry.add_subparsers(dest="registry_command", required=True)
    p = rsub.add_parser("check", help="validate a registry file (exit 1 if unsafe or expired)")
    p.add_argument("file")
    p.set_defaults(func=_registry_check)

    add_audit_commands(subparsers)


def parse_param(item: str) -> tuple[str, object]:
    """`k=v`: v as JSON when it parses as strict JSON, else the text itself."""
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise ValueError(f"--param {item!r}: expected K=V")
    try:
        return key, loads_strict(text)
    except ValueError:
        return key, text


def _keygen(args: argparse.Namespace) -> int:
    if not PRINCIPAL_NAME.fullmatch(args.principal):
        return _fail(f"principal {args.principal!r} is not lowercase [a-z0-9._-]")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    key_file, pub_file = out / f"{args.principal}.key", out / f"{args.principal}.pub"
    key = signing.generate_key()
    try:
        _write_new(key_file, signing.private_key_pem(key), 0o600)
        _write_new(pub_file, (signing.public_key_b64(key) + "\n").encode("ascii"), 0o644)
    except FileExistsError as exc:
        return _fail(f"{exc.filename} already exists; refusing to overwrite a key")
    _print(
        {
            "principal": args.principal,
            "kid": signing.kid_of(key),
            "publicKey": signing.public_key_b64(key),
            "keyFile": str(key_file),
            "pubFile": str(pub_file),
        }
    )
    return 0


def read_policy(path: str) -> object:
    """A policy document from a JSON or YAML file (`none`: null, a deletion)."""
    if path == "none":
        return None
    import yaml

    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: neither JSON nor YAML: {exc}") from None


def _propose(args: argparse.Namespace) -> int:
    try:
        params = dict(parse_param(item) for item in args.param)
        if args.policy is not None:
            if args.operation != "tenant-policy":
                raise ValueError("--policy goes with --operation tenant-policy")
            params["policySha256"] = policy_sha256(read_policy(args.policy))
        document = signing.propose(
            operation=args.operation,
            model_id=args.model,
            params=params,
            aud=args.aud,
            iss=args.iss,
            issued_at=args.issued_at if args.issued_at is not None else int(time.time()),
            ttl_s=args.ttl,
            policy_epoch=args.policy_epoch,
            nonce=args.nonce,
            signers=args.signer,
        )
    except (ValueError, GovernanceError) as exc:
        return _fail(str(exc), 2)
    _print(document)
    return 0


def _sign(args: argparse.Namespace) -> int:
    try:
        key = signing.load_private_key(Path(args.key).read_bytes())
        document = signing.sign(_read_document(args.file), key)
    except (OSError, ValueError, GovernanceError) as exc:
        return _fail(str(exc), 2)
    _print(signing.to_b64(document) if args.b64 else document)
    return 0


def _combine(args: argparse.Namespace) -> int:
    try:
        document = signing.combine(_read_document(f) for f in args.files)
    except (OSError, ValueError, GovernanceError) as exc:
        return _fail(str(exc), 2)
    _print(signing.to_b64(document) if args.b64 else document)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    try:
        _print(signing.inspect(_read_token(args.token)))
    except (OSError, ValueError, GovernanceError) as exc:
        return _fail(str(exc), 2)
    return 0


def _verify(args: argparse.Namespace) -> int:
    try:
        raw = _read_token(args.token)
        claims: dict[str, Any] = signing.inspect(raw)["claims"]
        registry = load_registry(args.registry)
        legacy_key = load_legacy_key(args.legacy_key) if args.legacy_key else None
        params = (
            dict(parse_param(p) for p in args.param)
            if args.param is not None
            else claims.get("params", {})
        )
    except (OSError, ValueError, GovernanceError) as exc:
        return _fail(str(exc), 2)
    verifier = Verifier(
        registry,
        MemoryNonceStore(time.time),
        MemoryAuditSink(),
        args.runner_id or str(claims.get("aud", "")),
        time.time,
        legacy_key,
    )
    operation = args.operation or str(claims["operation"])
    model = args.model if args.model is not None else claims.get("modelId")
    try:
        approval = asyncio.run(verifier.authorize(raw, operation, model, params))
    except GovernanceError as exc:
        _print({"ok": False, "status": exc.status, "code": exc.code, "message": str(exc)})
        return 1
    _print(
        {
            "ok": True,
            "operation": approval.operation,
            "modelId": approval.model_id,
            "principals": list(approval.principals),
            "keyIds": list(approval.key_ids),
            "legacy": approval.legacy,
            "expiresAt": approval.expires_at,
        }
    )
    return 0


def _registry_check(args: argparse.Namespace) -> int:
    try:
        registry = load_registry(args.file)
    except ConfigInvalid as exc:
        return _fail(f"refused: {exc}")
    summary = {
        "ok": not registry.expired(time.time()),
        "issuer": registry.issuer,
        "policyEpoch": registry.policy_epoch,
        "expiresAt": int(registry.expires_at),
        "principals": {name: list(kids) for name, kids in registry.principals.items()},
        "operations": {
            op: {"threshold": p.threshold, "principals": sorted(p.principals), "legacy": p.legacy}
            for op, p in registry.operations.items()
        },
    }
    _print(summary)
    if not summary["ok"]:
        return _fail(f"registry {args.file} has expired: every lifecycle call would get 503")
    return 0


def _read_text(value: str) -> str:
    if value == "-":
        return sys.stdin.read().strip()
    path = Path(value)
    if not value.startswith(("{", "eyJ")) and path.is_file():
        return path.read_text("utf-8").strip()
    return value.strip()


def _read_token(value: str) -> str:
    text = _read_text(value)
    if text.startswith('"'):  # a JSON string holding the b64 form, as `sign --b64` prints
        decoded = loads_strict(text)
        if isinstance(decoded, str):
            return decoded
    return text


def _read_document(value: str) -> dict[str, Any]:
    text = _read_token(value)
    document = loads_strict(b64url_decode(text) if text.startswith("eyJ") else text)
    if not isinstance(document, dict):
        raise ValueError(f"{value}: not a token document")
    return document


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def _print(value: object) -> None:
    print(json.dumps(value, indent=2))


def _fail(message: str, code: int = 1) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code

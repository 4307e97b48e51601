"""`quorum usage` and `quorum tenant set|delete|show`: billable usage and tenant policy.

    quorum usage [--from T] [--to T] [--tenant-id ID] [--model M] [--group-by hour|day]
                 [--json | --csv]
    quorum tenant set ID --policy FILE --token FILE     governed PUT /v1/tenants/{id}
    quorum tenant delete ID --token FILE                governed DELETE /v1/tenants/{id}
    quorum tenant show [ID]                             GET /v1/tenants (admins)

`--policy` is JSON or YAML; the token must be a `tenant-policy` token for ID whose
`policySha256` is the file's (RFC 8785; checked here, exit 2 and nothing sent if not).
`quorum usage` prints a table (one row per tenant, model and hour or day: requests
ok/cancelled/refused/failed, prompt, completion and cached tokens, engine and queue
seconds; images and audio seconds when any row has them), `--json` the API's document,
`--csv` the API's field names as a header and one line per row.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import httpx

from client.cli.common import OK, guarded, out, print_json
from client.core import identity_headers
from client.errors import RunnerRefused, RunnerUnreachable
from client.tokens import OpToken, read_token

USAGE_COLUMNS = (
    "start",
    "tenant",
    "model",
    "requests",
    "promptTokens",
    "completionTokens",
    "cachedTokens",
    "engineSeconds",
    "queueSeconds",
    "images",
    "audioSeconds",
)


def add_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from client.cli.common import add_common

    p = subparsers.add_parser("usage", help="billable usage per tenant, model and hour or day")
    p.add_argument("--from", dest="start", default=None, help="RFC 3339 or Unix seconds")
    p.add_argument("--to", dest="end", default=None, help="RFC 3339 or Unix seconds")
    p.add_argument("--tenant-id", dest="who", default=None, help="one tenant (admins)")
    p.add_argument("--model", default=None)
    p.add_argument("--group-by", default="hour", choices=("hour", "day"))
    p.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    add_common(p)
    p.set_defaults(func=usage)

    tenant = subparsers.add_parser("tenant", help="tenant policy: set, delete, show")
    sub = tenant.add_subparsers(dest="tenant_command", required=True)
    p = sub.add_parser("set", help="governed change of a tenant's policy")
    p.add_argument("id")
    p.add_argument("--policy", required=True, help="the policy (JSON or YAML file)")
    p.add_argument("--token", required=True, help="the tenant-policy token (file)")
    add_common(p)
    p.set_defaults(func=set_policy)
    p = sub.add_parser("delete", help="governed removal of a tenant's policy")
    p.add_argument("id")
    p.add_argument("--token", required=True, help="the tenant-policy token (file)")
    add_common(p)
    p.set_defaults(func=delete_policy)
    p = sub.add_parser("show", help="the tenants' policies (admins)")
    p.add_argument("id", nargs="?", default=None)
    add_common(p)
    p.set_defaults(func=show)


def _sha(policy: object) -> str:
    import rfc8785

    return hashlib.sha256(rfc8785.dumps(policy)).hexdigest()  # type: ignore[arg-type]


def _request(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    headers = identity_headers(args.tenant, args.api_key)
    try:
        answer = httpx.request(
            method, args.url.rstrip("/") + path, headers=headers, timeout=30, **kwargs
        )
    except httpx.TransportError as exc:
        raise RunnerUnreachable(args.url, str(exc) or type(exc).__name__) from None
    try:
        doc = answer.json()
    except ValueError:
        doc = None
    if answer.status_code >= 400:
        error = doc.get("error", {}) if isinstance(doc, dict) else {}
        raise RunnerRefused(
            args.url,
            answer.status_code,
            str(error.get("code", "error")),
            str(error.get("message", answer.text[:200])),
            body=doc,
        )
    return doc


def _token(path: str, tenant: str, policy: object) -> OpToken:
    token = read_token(path)
    if token.operation != "tenant-policy":
        raise ValueError(f"{path} approves {token.operation!r}, not 'tenant-policy'")
    if token.params.get("tenantId") != tenant:
        raise ValueError(f"{path} approves a policy for {token.params.get('tenantId')!r}")
    if token.params.get("policySha256") != _sha(policy):
        raise ValueError(f"{path} approves another policy than this one (policySha256)")
    return token


def _read_policy(path: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(Path(path).read_text("utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: cannot read a JSON or YAML policy: {exc}") from None


def set_policy(args: argparse.Namespace) -> int:
    def run() -> int:
        policy = _read_policy(args.policy)
        token = _token(args.token, args.id, policy)
        doc = _request(
            args,
            "PUT",
            f"/v1/tenants/{args.id}",
            json={"policy": policy, "verifiedOpToken": token.raw},
        )
        return _done(args, doc)

    return guarded(args, run)


def delete_policy(args: argparse.Namespace) -> int:
    def run() -> int:
        token = _token(args.token, args.id, None)
        doc = _request(
            args, "DELETE", f"/v1/tenants/{args.id}", json={"verifiedOpToken": token.raw}
        )
        return _done(args, doc)

    return guarded(args, run)


def _done(args: argparse.Namespace, doc: dict[str, Any]) -> int:
    if args.json:
        print_json({"ok": True, **doc})
    else:
        what = "deleted" if doc.get("deleted") else "set"
        approved = ", ".join(doc.get("approvedBy", []))
        out().print(
            f"tenant {doc['tenantId']} {what}: version {doc['version']} (approved by {approved})",
            markup=False,
        )
    return OK


def show(args: argparse.Namespace) -> int:
    def run() -> int:
        from rich.markup import escape
        from rich.table import Table

        doc = _request(args, "GET", "/v1/tenants")
        tenants = [t for t in doc["tenants"] if args.id in (None, t["tenantId"])]
        if args.json:
            print_json({"version": doc["version"], "tenants": tenants})
            return OK
        table = Table(title=f"tenant policies (version {doc['version']})")
        for column in ("tenant", "source", "version", "approved by", "policy"):
            table.add_column(column)
        for t in tenants:
            policy = json.dumps(t["policy"], sort_keys=True) if t["policy"] is not None else "-"
            table.add_row(
                escape(t["tenantId"]),
                t["source"],
                str(t["version"]),
                escape(", ".join(t["approvedBy"])),
                escape(policy),
            )
        out().print(table)
        return OK

    return guarded(args, run)


def usage(args: argparse.Namespace) -> int:
    def run() -> int:
        params = {
            k: v
            for k, v in {
                "from": args.start,
                "to": args.end,
                "tenant": args.who,
                "model": args.model,
                "group_by": args.group_by,
            }.items()
            if v
        }
        doc = _request(args, "GET", "/v1/usage", params=params)
        rows = doc["data"]
        if args.json:
            print_json(doc)
        elif args.csv:
            writer = csv.writer(sys.stdout)
            writer.writerow([*USAGE_COLUMNS, *(f"requests_{o}" for o in _OUTCOMES)])
            for row in rows:
                counts = [row["requestsByOutcome"][o] for o in _OUTCOMES]
                writer.writerow([*(row[c] for c in USAGE_COLUMNS), *counts])
        else:
            from rich.markup import escape
            from rich.table import Table

            by = doc["groupBy"]
            media = any(row["images"] or row["audioSeconds"] for row in rows)
            fields = USAGE_COLUMNS[4:] if media else USAGE_COLUMNS[4:9]
            table = Table(title=f"usage by {by}", caption="outcomes: ok/cancelled/refused/failed")
            for column in _TABLE[: len(_TABLE) if media else -2]:
                left = column in ("start", "tenant", "model")
                table.add_column(column, justify="left" if left else "right", no_wrap=left)
            for row in rows:
                start = str(row["start"]).replace("T", " ")[: 10 if by == "day" else 16]
                outcomes = "/".join(str(row["requestsByOutcome"][o]) for o in _OUTCOMES)
                figures = [
                    f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]) for c in fields
                ]
                table.add_row(
                    start,
                    escape(row["tenant"]),
                    escape(row["model"]),
                    str(row["requests"]),
                    outcomes,
                    *figures,
                )
            out().print(table)
        return OK

    return guarded(args, run)


_OUTCOMES = ("ok", "cancelled", "refused", "failed")
_TABLE = (
    "start",
    "tenant",
    "model",
    "requests",
    "outcomes",
    "prompt",
    "output",
    "cached",
    "engine s",
    "queue s",
    "images",
    "audio s",
)

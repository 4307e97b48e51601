"""What every operator verb shares: where the runner is, who asks, how to answer."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from client.errors import (
    BadToken,
    ClientError,
    LoadCancelled,
    LoadFailed,
    RunnerRefused,
    RunnerUnreachable,
)
from client.facades import Runner

if TYPE_CHECKING:
    from rich.console import Console

DEFAULT_URL = "http://127.0.0.1:8080"
OK, REFUSED, BAD_INPUT, UNREACHABLE, INTERRUPTED = 0, 1, 2, 3, 130


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=os.environ.get("QUORUM_URL") or DEFAULT_URL,
        help="the runner (default: QUORUM_URL, else %(default)s)",
    )
    p.add_argument("--tenant", default=os.environ.get("QUORUM_TENANT"), help="X-Tenant-ID")
    p.add_argument(
        "--api-key", default=os.environ.get("QUORUM_API_KEY"), help="the tenant's API key"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")


def runner(args: argparse.Namespace, url: str | None = None) -> Runner:
    return Runner(url or args.url, tenant=args.tenant, api_key=args.api_key)


def out() -> Console:
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


def err() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(doc: object) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def guarded(args: argparse.Namespace, body: Callable[[], int]) -> int:
    """Run a verb; its failures become the documented exit statuses and one line on stderr
    (with --json also a JSON document on stdout)."""
    try:
        return body()
    except KeyboardInterrupt:
        return _fail(args, INTERRUPTED, "interrupted", {})
    except (BadToken, ValueError) as exc:
        return _fail(args, BAD_INPUT, str(exc), {"error": str(exc)})
    except LoadFailed as exc:
        status = "cancelled" if isinstance(exc, LoadCancelled) else "failed"
        task = {"taskId": exc.task_id, "modelId": exc.model_id, "status": status}
        return _fail(args, REFUSED, str(exc), {**task, "error": exc.error})
    except RunnerRefused as exc:
        answer = {"httpStatus": exc.status, "code": exc.code, "error": exc.message}
        return _fail(args, REFUSED, str(exc), answer)
    except RunnerUnreachable as exc:
        return _fail(args, UNREACHABLE, str(exc), {"error": str(exc), "code": "unreachable"})
    except ClientError as exc:
        return _fail(args, REFUSED, str(exc), {"error": str(exc)})


def _fail(args: argparse.Namespace, code: int, message: str, doc: dict[str, Any]) -> int:
    if getattr(args, "json", False):
        print_json({"ok": False, **doc})
    err().print(f"quorum {args.command}: {message}", markup=False)
    return code

"""The operator's verbs on the `quorum` command, built on the client (HTTP only).

    quorum status [URL ...]                      models, memory, queues, health of runners
    quorum load MODEL --token FILE               governed load, followed with a progress bar
    quorum unload MODEL --token FILE             governed unload
    quorum flush --scope SCOPE --token FILE      governed cache flush
    quorum cancel TASK --token FILE              governed cancel of a load task
    quorum tasks [TASK ...]                      load tasks: the ones named, or those running
    quorum logs MODEL                            an engine's log lines (ADMIN_TENANTS only)
    quorum usage [--from --to --group-by ...]    billable usage (table, --json, --csv)
    quorum tenant set|delete|show ...            governed tenant policy (client/cli/tenants.py)

Each takes `--url` (default `QUORUM_URL`, else http://127.0.0.1:8080), `--tenant`
(`QUORUM_TENANT`), `--api-key` (`QUORUM_API_KEY`) and `--json` (one JSON document on
stdout instead of tables). Exit status: 0 done; 1 the runner refused or the task failed or
was cancelled (the reason on stderr); 2 bad input (a token that does not approve what the
command says); 3 no answer from the runner; 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

from client.cli.common import add_common


def _verb(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """The verb's function, imported when it runs (`quorum serve` never loads rich)."""

    def run(args: argparse.Namespace) -> int:
        code: int = getattr(importlib.import_module(f"client.cli.{module}"), name)(args)
        return code

    return run


def add_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the operator verbs on the `quorum` command's subparsers."""
    p = subparsers.add_parser("status", help="models, memory, queues and health of runners")
    p.add_argument("urls", nargs="*", metavar="URL", help="runners to show (default: --url)")
    add_common(p)
    p.set_defaults(func=_verb("status", "run"))

    p = subparsers.add_parser("load", help="governed load of a model, with a progress bar")
    p.add_argument("model")
    p.add_argument("--token", required=True, help="the model-load token (file)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between polls")
    p.add_argument("--timeout", type=float, default=None, help="stop following after S s")
    add_common(p)
    p.set_defaults(func=_verb("ops", "load"))

    p = subparsers.add_parser("unload", help="governed unload of a model")
    p.add_argument("model")
    p.add_argument("--token", required=True, help="the model-unload token (file)")
    add_common(p)
    p.set_defaults(func=_verb("ops", "unload"))

    p = subparsers.add_parser("flush", help="governed KV cache flush")
    p.add_argument("--scope", required=True, choices=("all", "model", "tenant", "tag"))
    p.add_argument("--model", default=None, help="modelId (scope model)")
    p.add_argument("--tenant-id", default=None, help="tenantId (scope tenant)")
    p.add_argument("--tag", default=None, help="tag (scope tag)")
    p.add_argument("--token", required=True, help="the cache-flush token (file)")
    add_common(p)
    p.set_defaults(func=_verb("ops", "flush"))

    p = subparsers.add_parser("cancel", help="governed cancel of a load task")
    p.add_argument("task")
    p.add_argument("--token", required=True, help="the task-cancel token for TASK (file)")
    add_common(p)
    p.set_defaults(func=_verb("ops", "cancel"))

    p = subparsers.add_parser("tasks", help="load tasks: those named, else those running")
    p.add_argument("tasks", nargs="*", metavar="TASK")
    add_common(p)
    p.set_defaults(func=_verb("ops", "tasks"))

    p = subparsers.add_parser("logs", help="an engine's log lines (admin tenants only)")
    p.add_argument("model")
    add_common(p)
    p.set_defaults(func=_verb("ops", "logs"))

    from client.cli.tenants import add_commands as add_tenant_commands

    add_tenant_commands(subparsers)

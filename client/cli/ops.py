"""`quorum load|unload|flush|cancel|tasks|logs`: one runner's governed operations and tasks.

A governed verb sends the body its token approves (client/tokens.py) after checking that
the token approves what the command line says (else exit 2, nothing sent).
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn
from rich.table import Table

from client.cli.common import INTERRUPTED, OK, err, guarded, out, print_json, runner
from client.lifecycle import LoadProgress
from client.tokens import OpToken, read_token


def _token(path: str, operation: str, model: str | None) -> OpToken:
    """The token in `path`, which must approve `operation` on `model` (ValueError if not)."""
    token = read_token(path)
    if token.operation != operation:
        raise ValueError(f"{path} approves {token.operation!r}, not {operation!r}")
    if model is not None and token.model_id != model:
        raise ValueError(f"{path} approves {operation} of {token.model_id!r}, not {model!r}")
    return token


def _eta(eta: float | None) -> str:
    return "-" if eta is None else f"{eta:.0f} s"


class LoadBar:
    """The load's progress: a live bar on a terminal, else one line per change."""

    def __init__(self, model: str) -> None:
        self.console = out()
        self.model = model
        self.last: LoadProgress | None = None
        self._printed: tuple[str, int] | None = None
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[status]}"),
            TextColumn("eta {task.fields[eta]}"),
            console=self.console,
            disable=not self.console.is_terminal,
        )
        self.task: TaskID | None = None

    def __enter__(self) -> LoadBar:
        self.progress.start()
        self.task = self.progress.add_task(escape(self.model), total=100, status="", eta="-")
        return self

    def __exit__(self, *_: object) -> None:
        self.progress.stop()

    def update(self, seen: LoadProgress) -> None:
        if self.last is None:
            self.console.print(f"task {seen.task_id} on {seen.url}", markup=False)
        self.last = seen
        assert self.task is not None
        self.progress.update(
            self.task, completed=100 * seen.progress, status=seen.status, eta=_eta(seen.eta)
        )
        if not self.console.is_terminal:
            key = (seen.status, int(100 * seen.progress))
            if key != self._printed:
                self._printed = key
                self.console.print(
                    f"{seen.status} {seen.progress:.0%} eta {_eta(seen.eta)}", markup=False
                )


def load(args: argparse.Namespace) -> int:
    return guarded(args, lambda: _load(args))


def _load(args: argparse.Namespace) -> int:
    token = _token(args.token, "model-load", args.model)
    with runner(args) as r:
        if args.json:
            result = r.load(
                token, model=args.model, interval_s=args.interval, timeout_s=args.timeout
            )
        else:
            bar = LoadBar(args.model)
            try:
                with bar:
                    result = r.load(
                        token,
                        model=args.model,
                        progress=bar.update,
                        interval_s=args.interval,
                        timeout_s=args.timeout,
                    )
            except KeyboardInterrupt:
                if bar.last is not None:
                    err().print(
                        f"stopped following {bar.last.task_id}; the load goes on at the runner "
                        f"(quorum tasks {bar.last.task_id}; quorum cancel {bar.last.task_id} "
                        "--token FILE stops it)",
                        markup=False,
                    )
                return INTERRUPTED
    doc = {
        "ok": True,
        "url": result.url,
        "taskId": result.task_id,
        "modelId": result.model_id,
        "status": "completed",
        "gpuMemoryUsedMB": result.gpu_memory_used_mb,
        "loadTimeMs": result.load_time_ms,
    }
    if args.json:
        print_json(doc)
    else:
        out().print(
            f"completed: {result.model_id} loaded on {result.url} in "
            f"{(result.load_time_ms or 0) / 1000:.1f} s, {result.gpu_memory_used_mb} MB",
            markup=False,
        )
    return OK


def unload(args: argparse.Namespace) -> int:
    def body() -> int:
        token = _token(args.token, "model-unload", args.model)
        with runner(args) as r:
            doc = dict(r.unload(token))
        _answer(args, doc, f"unloaded {doc.get('modelId')}: {doc.get('gpuMemoryFreedMB')} MB freed")
        return OK

    return guarded(args, body)


def flush(args: argparse.Namespace) -> int:
    def body() -> int:
        token = _token(args.token, "cache-flush", args.model)
        wanted = {"scope": args.scope, "tenantId": args.tenant_id, "tag": args.tag}
        for key, value in wanted.items():
            if value is not None and token.params.get(key) != value:
                raise ValueError(
                    f"{args.token} approves {key}={token.params.get(key)!r}, not {value!r}"
                )
        with runner(args) as r:
            doc = dict(r.flush(token))
        _answer(
            args,
            doc,
            f"flushed ({args.scope}): {doc.get('entriesRemoved')} entries, "
            f"{doc.get('memoryFreedMB')} MB",
        )
        return OK

    return guarded(args, body)


def cancel(args: argparse.Namespace) -> int:
    def body() -> int:
        token = _token(args.token, "task-cancel", None)
        with runner(args) as r:
            seen = r.cancel_load(args.task, token)
        _answer(args, _task_json(seen), f"{seen.task_id}: {seen.status}")
        return OK

    return guarded(args, body)


def tasks(args: argparse.Namespace) -> int:
    """Tasks by id (any status); without ids, the loads capabilities report as running
    (the runner has no endpoint that lists tasks with their ids)."""

    def body() -> int:
        with runner(args) as r:
            if args.tasks:
                rows = [_task_json(r.task(t)) for t in args.tasks]
            else:
                view = r.capabilities()
                rows = [
                    {
                        "taskId": None,
                        "modelId": m.id,
                        "status": "loading",
                        "progress": m.progress,
                        "eta": m.eta,
                    }
                    for m in view.loading
                ]
        if args.json:
            print_json({"tasks": rows})
            return OK
        if not rows:
            out().print("no load is running (name a task id to see a finished one)")
            return OK
        table = Table(title="Load tasks", title_justify="left")
        for column in ("task", "model", "status", "progress", "eta", "error"):
            table.add_column(column)
        for row in rows:
            table.add_row(
                escape(row["taskId"] or "-"),
                escape(row["modelId"]),
                escape(row["status"]),
                f"{row['progress']:.0%}",
                _eta(row["eta"]),
                escape(row.get("error") or ""),
            )
        out().print(table)
        return OK

    return guarded(args, body)


def logs(args: argparse.Namespace) -> int:
    def body() -> int:
        with runner(args) as r:
            lines = r.logs(args.model)
        if args.json:
            print_json({"modelId": args.model, "lines": lines})
        else:
            console = out()
            for line in lines:
                console.print(line, markup=False, highlight=False)
        return OK

    return guarded(args, body)


def _task_json(seen: LoadProgress) -> dict[str, Any]:
    return {
        "taskId": seen.task_id,
        "modelId": seen.model_id,
        "status": seen.status,
        "progress": seen.progress,
        "eta": seen.eta,
        "error": seen.error,
    }


def _answer(args: argparse.Namespace, doc: dict[str, Any], line: str) -> None:
    if args.json:
        print_json({"ok": True, **doc})
    else:
        out().print(line, markup=False)

"""`quorum status [URL ...]`: what each runner serves and how full it is, as tables.

Per runner: `/v1/capabilities` (models, memory, queue), `/health` (its verdict) and, for
the queue by priority, the `quorum_queue_depth{priority}` gauge of `/metrics` (absent when
the runner has metrics off). Exit 0 when every runner answered healthy, else 1.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from typing import Any

from rich.markup import escape
from rich.table import Table

from client.capabilities import PRIORITIES, Capabilities, parse_capabilities
from client.cli.common import OK, REFUSED, guarded, out, print_json, runner
from client.errors import ClientError, RunnerUnreachable

_DEPTH = re.compile(r'^quorum_queue_depth\{priority="(\w+)"\}\s+([0-9.e+-]+)$', re.MULTILINE)


@dataclass
class RunnerReport:
    url: str
    error: str | None = None
    health: dict[str, Any] = field(default_factory=dict)
    health_status: int | None = None
    capabilities: dict[str, Any] | None = None
    queue_by_priority: dict[str, int] | None = None

    @property
    def healthy(self) -> bool:
        return self.error is None and self.health_status == 200

    def view(self) -> Capabilities | None:
        return parse_capabilities(self.capabilities) if self.capabilities else None

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "reachable": self.error is None,
            "error": self.error,
            "healthy": self.healthy,
            "health": self.health,
            "capabilities": self.capabilities,
            "queueByPriority": self.queue_by_priority,
        }


def queue_by_priority(metrics_text: str) -> dict[str, int] | None:
    """The `quorum_queue_depth{priority}` gauge from a /metrics page; None if absent."""
    found = {name: round(float(value)) for name, value in _DEPTH.findall(metrics_text)}
    return found or None


def gather(args: argparse.Namespace, url: str) -> RunnerReport:
    report = RunnerReport(url)
    with runner(args, url) as r:
        report.url = r.url
        try:
            health = r.get("/health")
            report.health_status = health.status
            doc = health.json()
            report.health = doc if isinstance(doc, dict) else {}
            caps = r.get("/v1/capabilities")
            doc = caps.json()
            report.capabilities = doc if isinstance(doc, dict) else None
            metrics = r.get("/metrics")
            if metrics.status == 200:
                report.queue_by_priority = queue_by_priority(metrics.content.decode())
        except RunnerUnreachable as exc:
            report.error = exc.reason
        except ClientError as exc:
            report.error = str(exc)
    return report


def run(args: argparse.Namespace) -> int:
    return guarded(args, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    reports = [gather(args, url) for url in (args.urls or [args.url])]
    if args.json:
        print_json({"runners": [r.to_json() for r in reports]})
    else:
        console = out()
        console.print(runners_table(reports))
        console.print(models_table(reports))
    return OK if all(r.healthy for r in reports) else REFUSED


def runners_table(reports: list[RunnerReport]) -> Table:
    table = Table(title="Runners", title_justify="left")
    widest = max((len(r.url) for r in reports), default=10)
    table.add_column("runner", overflow="fold", min_width=min(widest, 40))
    for column in ("health", "memory", "KV cache", "queue", "high/normal/low", "p95 wait"):
        table.add_column(column)
    for report in reports:
        view = report.view()
        if view is None:
            table.add_row(
                escape(report.url),
                f"[red]unreachable[/red] {escape(report.error or '')}",
                *[""] * 5,
            )
            continue
        q = view.queue
        by = report.queue_by_priority
        table.add_row(
            escape(f"{view.runner_id}\n{report.url}"),
            _health(report),
            f"{view.gpu_memory_used_mb}/{view.gpu_memory_total_mb} MB ({view.memory_source})",
            f"{view.kv_cache_utilization:.0%} of {view.kv_cache_size_mb} MB",
            f"{q.depth}/{q.max_depth}" + (f", {q.running} running" if q.running else ""),
            "/".join(str(by.get(p, 0)) for p in PRIORITIES) if by else "-",
            f"{q.p95_wait_ms} ms",
        )
    return table


def models_table(reports: list[RunnerReport]) -> Table:
    table = Table(title="Models", title_justify="left")
    for column in ("runner", "model", "state", "memory", "detail"):
        table.add_column(column)
    for report in reports:
        view = report.view()
        if view is None:
            continue
        name = escape(view.runner_id)
        for m in view.loaded:
            ctx = f"context {m.context_length}" if m.context_length else ""
            table.add_row(name, escape(m.id), "[green]loaded[/green]", f"{m.gpu_memory_mb} MB", ctx)
        for lm in view.loading:
            eta = f", eta {lm.eta:.0f} s" if lm.eta is not None else ""
            table.add_row(
                name, escape(lm.id), "[yellow]loading[/yellow]", "", f"{lm.progress:.0%}{eta}"
            )
        for fm in view.failed:
            why = f"exit {fm.exit_code}" if fm.exit_code is not None else (fm.error or "")[:60]
            table.add_row(name, escape(fm.id), "[red]failed[/red]", "", escape(why))
        busy = {m.id for m in view.loaded} | {m.id for m in view.loading}
        busy |= {m.id for m in view.failed}
        for model in view.available:
            if model not in busy:
                table.add_row(name, escape(model), "available", "", "")
    return table


def _health(report: RunnerReport) -> str:
    status = escape(str(report.health.get("status", "?")))
    colour = "green" if report.healthy else "red"
    return f"[{colour}]{status}[/{colour}]"

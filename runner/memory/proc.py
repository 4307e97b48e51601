"""What a process tree holds in host memory, read from /proc (Linux only, no psutil).

Used two ways: `BudgetTelemetry` measures an engine by its tree's resident memory
(no GPU), and `NvmlTelemetry` widens an engine's pid to its descendants, since
engines such as vLLM put the GPU work in worker children.

Resident memory of one process is its RSS (`VmRSS` in /proc/<pid>/status): every page
it holds in memory, shared or not. PSS would divide shared pages among the processes
sharing them, so an engine's figure would shrink whenever anything else (another runner,
a hand-started server) maps the same model file, and the budget would overcommit; RSS
counts what the engine holds whoever else maps it. A forked tree sharing pages is then
over-counted, which errs on the safe side. A process that exits while being read
counts 0.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

PROC = Path("/proc")
KIB_PER_MIB = 1024


def parent_pids(proc: Path = PROC) -> dict[int, int]:
    """pid -> parent pid for every process now in `proc`."""
    parents: dict[int, int] = {}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        # `pid (comm) state ppid ...`: comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 2:
            parents[int(entry.name)] = int(fields[1])
    return parents


def child_pids(pid: int, proc: Path = PROC) -> list[int] | None:
    """The direct children of `pid`, from `/proc/<pid>/task/*/children` (a few small reads,
    where `parent_pids` reads the stat of every process on the host); [] when `pid` is gone,
    None when the kernel has no such files (CONFIG_PROC_CHILDREN off)."""
    task_dir = proc / str(pid) / "task"
    try:
        tids = os.listdir(task_dir)
    except FileNotFoundError:
        return [] if not (proc / str(pid)).exists() else None
    except OSError:
        return []
    found: list[int] = []
    for tid in tids:
        try:
            found.extend(int(c) for c in Path(task_dir, tid, "children").read_text().split())
        except FileNotFoundError:
            if not Path(task_dir, tid).exists():  # that thread ended meanwhile
                continue
            return None
        except OSError:
            continue
    return found


def process_tree(pids: Iterable[int], proc: Path = PROC) -> set[int]:
    """`pids` and all their living descendants (children, grandchildren, ...): walked down
    the children files, or, without them, through the whole process table."""
    roots = list(pids)
    tree = _walk(roots, lambda pid: child_pids(pid, proc))
    return tree if tree is not None else tree_from_table(roots, proc)


def tree_from_table(pids: Iterable[int], proc: Path = PROC) -> set[int]:
    """`process_tree` through the stat of every process (kernels without children files)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_pids(proc).items():
        children.setdefault(ppid, []).append(pid)
    tree = _walk(list(pids), lambda pid: children.get(pid, []))
    assert tree is not None  # the table always answers
    return tree


def _walk(roots: list[int], children: Callable[[int], list[int] | None]) -> set[int] | None:
    """`roots` and every descendant `children` names; None as soon as it cannot tell."""
    tree: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in tree:
            continue
        kids = children(pid)
        if kids is None:
            return None
        tree.add(pid)
        todo.extend(kids)
    return tree


def _field_kib(path: Path, name: str) -> int | None:
    """The `name:  N kB` line of a /proc file in KiB; None when the file or line is missing."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return None


def resident_kib(pid: int, proc: Path = PROC) -> int:
    """One process's resident memory in KiB: RSS (`VmRSS`), else 0 (gone or kernel thread)."""
    rss = _field_kib(proc / str(pid) / "status", "VmRSS")
    return rss if rss is not None else 0


def tree_resident_mb(pids: Iterable[int], proc: Path = PROC) -> int:
    """Resident memory of `pids` and all their descendants, in MiB (rounded down)."""
    total_kib = sum(resident_kib(pid, proc) for pid in process_tree(pids, proc))
    return total_kib // KIB_PER_MIB


def mem_available_mb(meminfo: Path = PROC / "meminfo") -> int:
    """`MemAvailable` of /proc/meminfo in MiB: what the kernel could give without swapping."""
    kib = _field_kib(meminfo, "MemAvailable")
    if kib is None:
        raise OSError(f"no MemAvailable line in {meminfo}")
    return kib // KIB_PER_MIB

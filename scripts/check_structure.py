"""What `scripts/lint` checks of the product packages' shape, beyond ruff, mypy and the
import contracts: no module over `MAX_LINES` lines (split a module as it passes ~400), and
no class name defined twice (one concept, one name: a reader who meets a class name finds
one definition). Exits 1 naming every offender.

    python scripts/check_structure.py [ROOT]
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

PACKAGES = ("runner", "adapters", "tenants", "governance", "faults", "client")
MAX_LINES = 400


def modules(root: Path) -> list[Path]:
    """Every Python module of the product packages under `root`."""
    return sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py"))


def too_long(root: Path, limit: int = MAX_LINES) -> list[str]:
    """`path: N lines` for each module over `limit` lines."""
    found = []
    for path in modules(root):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            found.append(f"{path.relative_to(root)}: {lines} lines (at most {limit})")
    return found


def class_names(tree: ast.AST) -> list[tuple[str, int]]:
    """Each class a module defines, with its line: `class` statements, and the error rows
    (`Name = Base.row("Name", ...)`, faults.QuorumError.row: a class made by a call)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            found.append((node.name, node.lineno))
        elif (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "row"
            and node.value.args
            and isinstance(node.value.args[0], ast.Constant)
            and isinstance(node.value.args[0].value, str)
        ):
            found.append((node.value.args[0].value, node.lineno))
    return found


def twice(root: Path) -> list[str]:
    """`Name: path:line, path:line` for each class name defined more than once."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in modules(root):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for name, line in class_names(tree):
            where[name].append(f"{path.relative_to(root)}:{line}")
    return [
        f"{name}: {', '.join(places)}" for name, places in sorted(where.items()) if len(places) > 1
    ]


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    problems = [f"module too long: {p}" for p in too_long(root)]
    problems += [f"class defined twice: {p}" for p in twice(root)]
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

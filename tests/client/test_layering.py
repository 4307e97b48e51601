"""The client is what outsiders run: it must not need the runner's own packages."""

from __future__ import annotations

import ast
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[2] / "client"
FORBIDDEN = ("runner", "adapters", "tenants", "governance", "tests")


def test_client_imports_no_runner_package() -> None:
    """No module under client/ imports runner/, adapters/, tenants/ or governance/."""
    found = []
    for path in sorted(CLIENT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            found += [
                f"{path.relative_to(CLIENT.parent)}: {name}"
                for name in names
                if name.split(".")[0] in FORBIDDEN
            ]
    assert found == []

"""docs/reliability.md names its proofs: every `tests/...py::test` it names exists.

Each row of the failure contract names the tests that prove it (`file::test`, further
tests of the same file as `::test`, parametrised cases as `[id]`). A renamed or deleted
test would leave a row claiming a proof that is gone; this reads the document and the
test files (their source, nothing is run) and fails naming every such claim. The tests
themselves run with the rest of the suite.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reliability.md"
_NAMED = re.compile(r"`(tests/[\w/]+\.py)?::(\w+)(?:\[[^\]`]*\])?`")


def named_proofs(text: str) -> list[tuple[str, str]]:
    """(file, test) for every proof the text names; `::test` belongs to the file named
    last before it on the same line."""
    found = []
    for line in text.splitlines():
        current = None
        for match in _NAMED.finditer(line):
            current = match.group(1) or current
            if current is not None:
                found.append((current, match.group(2)))
    return found


def _defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    }


def test_named_proofs_parse_files_and_continuations() -> None:
    """`a.py::x`, `::y` on one line name a.py's x and y; a bare `::z` with no file before
    it on its line names nothing."""
    text = "- `tests/a.py::x[p]`, `::y`\n- `::z`"
    assert named_proofs(text) == [("tests/a.py", "x"), ("tests/a.py", "y")]


def test_every_proof_reliability_md_names_exists() -> None:
    """Every test docs/reliability.md names is defined in the file it names."""
    proofs = named_proofs(DOC.read_text())
    assert len(proofs) > 50  # the document still names its proofs this way
    missing = []
    defined: dict[str, set[str]] = {}
    for file, test in proofs:
        path = REPO / file
        if not path.exists():
            missing.append(f"{file} (no such file)")
            continue
        if file not in defined:
            defined[file] = _defined_tests(path)
        if test not in defined[file]:
            missing.append(f"{file}::{test}")
    assert not missing, missing

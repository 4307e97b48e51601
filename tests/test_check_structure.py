"""What scripts/check_structure.py (run by scripts/lint) refuses in the product packages: a
module over 400 lines, a class name defined twice (a class statement or an error row)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.runner_proc import REPO_ROOT

pytestmark = pytest.mark.timeout(30)


def _script() -> ModuleType:
    path = REPO_ROOT / "scripts" / "check_structure.py"
    spec = importlib.util.spec_from_file_location("check_structure", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_structure"] = module
    spec.loader.exec_module(module)
    return module


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_check_structure_refuses_long_modules_and_names_defined_twice(tmp_path: Path) -> None:
    """A module of 401 lines and a name defined as a class in one package and as an error
    row in another are each named; 400 lines and distinct names pass."""
    check = _script()
    root = _tree(
        tmp_path,
        {
            "runner/long.py": "x = 1\n" * 401,
            "runner/ok.py": "x = 1\n" * 400,
            "runner/a.py": "class Twice:\n    pass\n",
            "client/b.py": 'Twice = Base.row("Twice", "twice")\nclass Once:\n    pass\n',
        },
    )
    assert check.too_long(root) == ["runner/long.py: 401 lines (at most 400)"]
    assert check.twice(root) == ["Twice: client/b.py:1, runner/a.py:1"]
    assert check.main(["check", str(root)]) == 1
    clean = _tree(tmp_path / "clean", {"adapters/a.py": "class A:\n    pass\n"})
    assert check.main(["check", str(clean)]) == 0


def test_check_structure_the_product_packages_pass() -> None:
    """The repository itself: no module over 400 lines, every class name defined once."""
    assert _script().main(["check", str(REPO_ROOT)]) == 0

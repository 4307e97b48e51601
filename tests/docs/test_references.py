"""Docs that cannot drift: every file path, module and symbol the docs cite exists.

Read: docs/*.md, README.md, and the module docstrings of the product packages (PRODUCT).
Nothing is imported or run: the source is read with `ast`. A failure names each citation
that resolves to nothing, with where it was found.

What is a citation, and how it resolves:

1. A path: a word that starts with a top folder of the repository (TOP_FOLDERS: `runner/`,
   `tests/`, `scripts/`, `bench/`, `deploy/`, `docs/`, ...), in backticks or not, or a
   Markdown link's target. It must name a file or folder of the repository.
   - `file.py::name` names a function or class defined in that file as well.
   - `folder/module.symbol` (a module's path without `.py`, then a dotted name:
     `runner/engines/pool.ModelPool`) names that symbol in that module (rule 3).
   - `<...>`, `{...}` and `*` are placeholders: something must match. A path that git
     ignores (the benches' `bench/results/`) is a run's output and is taken as cited.
   - `path@commit` (a measurement of an older tree: `runner/proxy.py@cae211a`) names the
     path as it was at that commit (when git knows the commit; a shallow clone may not).
   - An HTML comment (`<!-- ... -->`, a generated block's markers) and a fenced code
     block (commands, whose words are a shell's: `kubectl ... deploy/quorum-runner`) cite
     nothing.
2. A dotted name in backticks whose first part is a top package (`governance.verifier.
   Verifier`, `runner.scheduler.models.admission`): the longest prefix that is a module,
   then the rest as attributes of it (rule 3).
3. Attributes: a module's top-level functions, classes, assignments and imports (an
   imported name is followed to its module), its submodules; a class's methods,
   class-level names and fields, the `self.x` its methods assign, and those of its bases
   that the repository defines. A dotted name goes on past a class member only through a
   nested class. A trailing `()` is ignored.
4. Shorthand, in backticks: `module.symbol` and `Class.member`.
   - `module` is the last part of a product module's name (`models`, `pool`, `core`). In a
     module docstring, a module of the same package is meant if it has one (the text is
     about its own room); otherwise, and in a document, any product module of that name
     that defines the symbol.
   - `Class` is a class the product packages define: (one of) the class(es) of that
     name must have the member.
   - Field paths of the runner's documents (`models.failed`, `queue.forecastWaitMs`):
     when the first part is in FIELD_ROOTS (and no module of the docstring's own package)
     and the second is a key the product writes in a dict literal (the documents' and the
     OpenAPI document's fields), it is a field, not code. Otherwise the name must resolve
     as code (`models.refusal` fails).
   - ASGI's message types (`http.response.start`) are ASGI's; OpenTelemetry's attribute
     names (`http.route`, `server.port`: OTEL_ATTRIBUTES) are OpenTelemetry's.
   - A bare file name (`errors.py`, `compose.yaml`: FILE_SUFFIXES) is not checked: which
     file is meant depends on the text; cite `folder/file.py` to have it checked.
   - A first part that is neither, followed by a class the product defines
     (`loop.SchedulerAdmission`), cites a module that does not exist: it fails.
   - Anything else (`httpx.AsyncClient`, `gc.freeze()`, an engine's own files, and in a
     docstring a library its module imports: `limits.aio.storage`) is not this
     repository's and is not checked.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from tests.docs.source_index import (
    PACKAGES,
    PRODUCT,
    REPO,
    ModuleInfo,
    by_last_part,
    document_fields,
    modules,
    product_classes,
    resolve_dotted,
    resolve_in_class,
    resolve_in_module,
)

TOP_FOLDERS = (*PACKAGES, "deploy", "docs")
DOCUMENTS = (*sorted((REPO / "docs").glob("*.md")), REPO / "README.md")
FIELD_ROOTS = frozenset({"models", "queue", "capabilities", "usage", "health", "error"})
"""Sections of the runner's JSON documents whose names are also product modules' (rule 4)."""
ASGI_MESSAGES = re.compile(
    r"^(http|websocket)\.(request|response|disconnect|connect|accept|send|receive|close)\b"
)
OTEL_ATTRIBUTES = re.compile(
    r"^(http\.(route|request\.method|response\.status_code)|server\.(address|port))$"
)
"""OpenTelemetry's semantic-convention attribute names whose namespace is also a product
module's name (docs/operations.md, "Tracing")."""
FILE_SUFFIXES = frozenset({"py", "md", "json", "yaml", "yml", "toml", "sh", "js", "txt", "html"})

_TOP = "|".join(TOP_FOLDERS)
_PATH = re.compile(rf"(?<![\w/.-])((?:{_TOP})/[\w./*<>{{}}\-]*(?:::\w+|@[0-9a-f]{{7,40}})?)")
_LINK = re.compile(r"\]\(([^)\s#]+)")
_SPAN = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?$")
_FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1", re.S | re.M)
_COMMENT = re.compile(r"<!--.*?-->", re.S)


def check_path(cited: str) -> str | None:
    """Why `cited` (rule 1) resolves to nothing; None when it names something."""
    text = cited.rstrip(".,;:)")
    text, _, commit = text.partition("@")
    if commit:
        return None if _in_history(commit, text) else f"not in {commit}"
    text, _, test = text.partition("::")
    if re.search(r"[<>{}*]", text):
        pattern = re.sub(r"<[^>]*>|\{[^}]*\}", "*", text)
        if any(REPO.glob(pattern.rstrip("/"))) or _ignored(text):
            return None
        return "no file matches"
    path = REPO / text
    if path.exists():
        if test and path.suffix == ".py":
            tree = ast.parse(path.read_text())
            defined = {
                n.name
                for n in ast.walk(tree)
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            }
            return None if test in defined else f"no {test} in {text}"
        return None
    folder, _, last = text.rstrip("/").rpartition("/")
    if "." in last and not last.endswith((".py", ".md", ".json", ".yaml", ".yml", ".toml")):
        stem, _, symbol = last.partition(".")
        name = ".".join([*folder.split("/"), stem])
        module = modules().get(name)
        if module is not None:
            return (
                None if resolve_in_module(module, symbol.split(".")) else f"no {symbol} in {name}"
            )
    return None if _ignored(text) else "no such file or folder"


def _git(*args: str) -> int | None:
    """git's exit status, None when git cannot be run here."""
    try:
        return subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, timeout=10
        ).returncode
    except (OSError, subprocess.TimeoutExpired):
        return None


def _in_history(commit: str, path: str) -> bool:
    """`path` existed at `commit` (or git cannot tell: no git, or a shallow clone)."""
    if _git("cat-file", "-e", f"{commit}^{{commit}}") != 0:
        return True
    return _git("cat-file", "-e", f"{commit}:{path.rstrip('/')}") == 0


@functools.cache
def _ignored(text: str) -> bool:
    """Git ignores it (a run's output, e.g. bench/results/)."""
    head = re.split(r"[<>{}*]", text)[0] or text
    probe = head if head.endswith("/") or "." in head.rpartition("/")[2] else head + "x"
    return _git("check-ignore", "-q", "--no-index", probe) == 0


def check_name(dotted: str, home: ModuleInfo | None) -> str | None:
    """Why the backticked dotted name (rules 2 and 4) resolves to nothing; None when it
    resolves or is not this repository's to check. `home`: the docstring's module."""
    parts = dotted.split(".")
    first = parts[0]
    if parts[-1] in FILE_SUFFIXES:
        return None  # a bare file name
    if first in PACKAGES:
        return None if resolve_dotted(dotted) else "no such module or symbol"
    if home is not None and first in home.libraries:
        return None  # the docstring's module imports a library of that name: it is the library's
    if home is not None:  # a module docstring: its own package first
        package = home.name if home.path.name == "__init__.py" else home.name.rpartition(".")[0]
        sibling = modules().get(f"{package}.{first}")
        if sibling is not None:
            return None if resolve_in_module(sibling, parts[1:]) else f"not in {sibling.name}"
        if first in home.classes:
            return (
                None
                if resolve_in_class(home, home.classes[first], parts[1:], 0)
                else f"not in {home.name}.{first}"
            )
    if ASGI_MESSAGES.match(dotted) or OTEL_ATTRIBUTES.match(dotted):
        return None
    if first in FIELD_ROOTS and parts[1] in document_fields():
        return None  # a field of the runner's JSON documents
    candidates = by_last_part().get(first, [])
    classes = product_classes().get(first, [])
    if candidates or classes:
        if any(resolve_in_module(m, parts[1:]) for m in candidates):
            return None
        if any(resolve_in_class(m, c, parts[1:], 0) for m, c in classes):
            return None
        where = ", ".join(
            sorted([m.name for m in candidates] + [f"{m.name}.{first}" for m, _ in classes])
        )
        return f"not in {where}"
    if first[:1].islower() and any(p in product_classes() for p in parts[1:]):
        return "no such module"
    return None


@dataclass(frozen=True)
class Citation:
    where: str
    text: str
    kind: str  # "path" or "name"


def citations(text: str, where: str, *, markdown: bool) -> Iterator[Citation]:
    """The paths (anywhere in `text`, and a Markdown link's target, relative to the
    document) and the dotted names (in backticks) it cites."""
    if markdown:
        folder = (REPO / where).parent
        for target in _LINK.findall(text):
            if not re.match(r"^[a-z]+:", target):
                path = (folder / target).resolve()
                relative = path.relative_to(REPO) if path.is_relative_to(REPO) else path
                yield Citation(where, str(relative), "path")
        text = _COMMENT.sub("", _FENCE.sub("", text))
    for match in _PATH.finditer(text):
        yield Citation(where, match.group(1), "path")
    for span in _SPAN.findall(text):
        dotted = _DOTTED.match(span.strip())
        if dotted is not None and "/" not in span:
            yield Citation(where, dotted.group(1), "name")


def broken(text: str, where: str, home: ModuleInfo | None, *, markdown: bool) -> list[str]:
    found = []
    for cited in citations(text, where, markdown=markdown):
        why = check_path(cited.text) if cited.kind == "path" else check_name(cited.text, home)
        if why is not None:
            found.append(f"{where}: `{cited.text}` ({why})")
    return found


def test_paths_resolve_by_file_test_symbol_and_pattern() -> None:
    """A file, a `file::test`, a `folder/module.Symbol`, a pattern and an ignored output
    path resolve; a missing file, a missing test and a missing symbol are named."""
    text = (
        "`runner/scheduler/core.py`, tests/docs/test_references.py::test_paths_resolve_by_file"
        "_test_symbol_and_pattern, `runner/scheduler/core.Scheduler.handle`, "
        "`adapters/*/engine.py`... `bench/results/fairness-<time>.json` "
        "`runner/admission.py` `tests/docs/test_references.py::gone` `runner/scheduler/core.Nope`"
    )
    assert [line.split(": ", 1)[1] for line in broken(text, "x", None, markdown=False)] == [
        "`runner/admission.py` (no such file or folder)",
        "`tests/docs/test_references.py::gone` (no gone in tests/docs/test_references.py)",
        "`runner/scheduler/core.Nope` (no Nope in runner.scheduler.core)",
    ]


def test_names_resolve_in_their_room_and_skip_what_is_not_ours() -> None:
    """Full and shorthand names resolve (a docstring's own package first); JSON fields,
    libraries and engine files are left alone; a stale module or symbol is named."""
    core = modules()["runner.scheduler.errors"]
    pool = modules()["runner.engines.pool"]
    ok = (
        "`governance.verifier.Verifier` `models.admission` `core.Scheduler.handle` "
        "`Scheduler.models()` `models.failed` `queue.forecastWaitMs` `httpx.AsyncClient` "
        "`gc.freeze()` `main.py` `RunnerPool.chat` `Runner.url` `http.response.start`"
    )
    assert broken(ok, "x", pool, markdown=False) == []
    assert broken(ok, "x", None, markdown=True) == []
    stale = "`models.refusal` `forecast.position` `loop.SchedulerAdmission` `runner.nope.X`"
    assert [line.split(": ", 1)[1] for line in broken(stale, "x", core, markdown=False)] == [
        "`models.refusal` (not in runner.scheduler.models)",
        "`forecast.position` (not in runner.scheduler.forecast)",
        "`loop.SchedulerAdmission` (no such module)",
        "`runner.nope.X` (no such module or symbol)",
    ]


def test_docs_and_docstrings_cite_only_what_exists() -> None:
    """Every path, module and symbol that docs/*.md, README.md and the product's module
    docstrings cite exists (rules in this module's docstring)."""
    found = []
    for path in DOCUMENTS:
        found += broken(path.read_text(), str(path.relative_to(REPO)), None, markdown=True)
    for name, info in sorted(modules().items()):
        if name.split(".")[0] in PRODUCT and info.docstring:
            where = str(info.path.relative_to(REPO))
            found += broken(info.docstring, where, info, markdown=False)
    assert not found, "\n".join(found)

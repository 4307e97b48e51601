"""The catalog: which models this runner can load, and where their files are.

`models.available` in capabilities is the union of (1) the models file, (2) model files
under `MODEL_BASE_PATH` (`*.gguf` files and directories holding `*.safetensors`), and
(3) repositories in the Hugging Face cache under `HF_HOME` (`models--org--name`).

A load names a model by its id in the models file, by a path (relative to
`MODEL_BASE_PATH`, or absolute inside one of the allowed roots), or by a Hugging Face
repo id (`org/name`). `resolve` turns any of these into a `ModelSpec`, and refuses a
path outside the allowed roots (`..`, symlinks out, absolute paths elsewhere) with 400:
`modelId` is never a way to read arbitrary files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from adapters.kind import EngineKind
from runner.engines.kinds import EngineKinds
from runner.errors import BadRequest, ModelNotFound
from runner.floor.models_file import ModelSpec

_HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


@dataclass(frozen=True, slots=True)
class Roots:
    """Where model files may come from."""

    model_base: Path
    hf_home: Path | None
    configured: tuple[Path, ...] = ()  # directories of paths in the models file

    def allowed(self) -> tuple[Path, ...]:
        roots = [self.model_base, *self.configured]
        if self.hf_home is not None:
            roots.append(self.hf_home)
        return tuple(r.resolve() for r in roots)


def hf_cache_dir(hf_home: Path) -> Path:
    """Where huggingface_hub keeps repositories under HF_HOME."""
    return hf_home / "hub"


def hf_repo_dir(hf_home: Path, repo_id: str) -> Path:
    return hf_cache_dir(hf_home) / ("models--" + repo_id.replace("/", "--"))


def is_hf_repo_id(model_id: str) -> bool:
    return bool(_HF_REPO.match(model_id)) and ".." not in model_id


def inside(path: Path, roots: Iterable[Path]) -> bool:
    """`path` (symlinks resolved) lies inside one of `roots`."""
    real = path.resolve()
    return any(real == r or r in real.parents for r in roots)


def scan_base(model_base: Path, limit: int = 1000) -> list[str]:
    """Model names under MODEL_BASE_PATH: GGUF files and safetensors directories, relative."""
    found: list[str] = []
    if not model_base.is_dir():
        return found
    for dirpath, dirnames, filenames in os.walk(model_base):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        here = Path(dirpath)
        if any(f.endswith(".safetensors") for f in filenames) and here != model_base:
            found.append(str(here.relative_to(model_base)))
        found += [
            str((here / f).relative_to(model_base))
            for f in sorted(filenames)
            if f.endswith(".gguf")
        ]
        if len(found) >= limit:
            break
    return found[:limit]


def scan_hf_cache(hf_home: Path | None) -> list[str]:
    """Repo ids in the Hugging Face cache (`models--org--name` directories with a snapshot)."""
    if hf_home is None:
        return []
    cache = hf_cache_dir(hf_home)
    if not cache.is_dir():
        return []
    repos = []
    for entry in sorted(cache.iterdir()):
        if entry.name.startswith("models--") and (entry / "snapshots").is_dir():
            repos.append(entry.name.removeprefix("models--").replace("--", "/", 1))
    return repos


def available(specs: Sequence[ModelSpec], roots: Roots) -> list[str]:
    names = [s.id for s in specs]
    names += scan_base(roots.model_base)
    names += scan_hf_cache(roots.hf_home)
    return list(dict.fromkeys(names))


def hf_snapshot(hf_home: Path | None, repo_id: str) -> Path | None:
    """The newest local snapshot of `repo_id` in the HF cache, if any."""
    if hf_home is None:
        return None
    snapshots = hf_repo_dir(hf_home, repo_id) / "snapshots"
    if not snapshots.is_dir():
        return None
    dirs = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime)
    return dirs[-1] if dirs else None


def resolve(
    model_id: str,
    specs: dict[str, ModelSpec],
    roots: Roots,
    kinds: EngineKinds,
    backend: str,
    quantization: str | None = None,
) -> tuple[ModelSpec, str | None]:
    """The spec to load for `model_id` (a new one of `backend`), and the HF repo to download
    first (or None).

    1. An id of the models file (or one loaded before): its entry; one naming only an `hf`
       repo whose files are not on disk is downloaded first when its engine cannot fetch
       them itself (`EngineKind.downloads_first`: llama-server; an earlier download
       failed or was cancelled).
    2. A path (relative to MODEL_BASE_PATH, or absolute) inside the allowed roots: a spec
       for that file; outside them, or `..`: 400.
    3. An `org/name` repo id: its local snapshot in the HF cache, else (none, or one a
       download left without the model's files) download it first.
    4. Anything else: 404.
    """
    if model_id in specs:  # 1
        known = specs[model_id]
        if known.hf and kinds.of(known).downloads_first(kinds.engine_spec(known)):
            return known, known.hf
        return known, None
    kind = kinds.named(backend)
    if "\x00" in model_id or len(model_id) > 1024:
        raise BadRequest("modelId is not a valid model name or path")
    candidate = Path(model_id)
    if candidate.is_absolute() or ".." in candidate.parts or candidate.suffix == ".gguf":  # 2
        path = candidate if candidate.is_absolute() else roots.model_base / candidate
        if ".." in candidate.parts or not inside(path, roots.allowed()):
            raise BadRequest("modelId names a path outside the runner's model directories")
        if not path.exists():
            raise ModelNotFound(f"model {model_id!r} does not exist under the model directories")
        return _spec_for_path(model_id, path, kind, quantization), None
    base_path = roots.model_base / candidate
    if base_path.exists() and inside(base_path, roots.allowed()):
        return _spec_for_path(model_id, base_path, kind, quantization), None
    if is_hf_repo_id(model_id):  # 3
        snapshot = hf_snapshot(roots.hf_home, model_id)
        if snapshot is not None and _holds_model(snapshot, kind, quantization):
            return _spec_for_path(model_id, snapshot, kind, quantization), None
        spec = ModelSpec(id=model_id, backend=backend, hf=model_id, quantization=quantization)
        return spec, model_id
    raise ModelNotFound(f"model {model_id!r} is not in the catalog")  # 4


def _holds_model(snapshot: Path, kind: EngineKind, quantization: str | None) -> bool:
    """Whether a snapshot has the model's files (a download under way or cut short leaves
    the directory without them): the file its kind loads, or anything at all."""
    found = kind.model_file(snapshot, quantization)
    return found is not None and (found != snapshot or any(snapshot.iterdir()))


def _spec_for_path(
    model_id: str, path: Path, kind: EngineKind, quantization: str | None
) -> ModelSpec:
    target = path
    if path.is_dir():
        found = kind.model_file(path, quantization)
        if found is None:
            raise BadRequest(f"model {model_id!r}: no model file in {path.name} for {kind.name}")
        target = found
    return ModelSpec(id=model_id, backend=kind.name, path=str(target), quantization=quantization)

"""The catalog: what can be loaded, and never a path outside the allowed roots."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.engines.kinds import EngineKinds
from runner.errors import BadRequest, ModelNotFound
from runner.floor.models_file import ModelSpec
from runner.lifecycle.catalog import Roots, available, resolve, scan_hf_cache

KINDS = EngineKinds()


@pytest.fixture
def roots(tmp_path: Path) -> Roots:
    base = tmp_path / "models"
    (base / "llama").mkdir(parents=True)
    (base / "llama" / "tiny-q4_k_m.gguf").write_bytes(b"GGUF" + b"\0" * 100)
    (base / "st").mkdir()
    (base / "st" / "model.safetensors").write_bytes(b"\0" * 10)
    hf = tmp_path / "hf"
    snap = hf / "hub" / "models--org--repo" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "repo-Q4_K_M.gguf").write_bytes(b"GGUF")
    (tmp_path / "secret.gguf").write_bytes(b"GGUF")
    return Roots(base, hf)


def test_catalog_available_lists_file_base_path_and_hf_cache(roots: Roots) -> None:
    """models.available joins the models file, MODEL_BASE_PATH and the HF cache."""
    spec = ModelSpec(id="from-file", backend="llama-server", path="/x.gguf")
    names = available([spec], roots)
    assert names == ["from-file", "llama/tiny-q4_k_m.gguf", "st", "org/repo"]
    assert scan_hf_cache(None) == []


def test_catalog_resolve_relative_path_under_base(roots: Roots) -> None:
    """A path relative to MODEL_BASE_PATH resolves to a spec for that file."""
    spec, download = resolve("llama/tiny-q4_k_m.gguf", {}, roots, KINDS, "llama-server")
    assert download is None
    assert spec.path is not None and spec.path.endswith("tiny-q4_k_m.gguf")


@pytest.mark.parametrize(
    "model_id", ["../secret.gguf", "llama/../../secret.gguf", "/etc/passwd", "/tmp/x.gguf"]
)
def test_catalog_resolve_refuses_paths_outside_roots(roots: Roots, model_id: str) -> None:
    """`..` and absolute paths outside the allowed roots are refused with 400."""
    with pytest.raises(BadRequest):
        resolve(model_id, {}, roots, KINDS, "llama-server")


def test_catalog_resolve_refuses_symlink_out(roots: Roots, tmp_path: Path) -> None:
    """A symlink under MODEL_BASE_PATH that points outside is refused."""
    (roots.model_base / "escape.gguf").symlink_to(tmp_path / "secret.gguf")
    with pytest.raises(BadRequest):
        resolve("escape.gguf", {}, roots, KINDS, "llama-server")


def test_catalog_resolve_hf_repo_local_snapshot_or_download(roots: Roots) -> None:
    """A repo id in the HF cache loads from its snapshot; one that is not, is downloaded."""
    spec, download = resolve("org/repo", {}, roots, KINDS, "llama-server")
    assert download is None and spec.path is not None and spec.path.endswith(".gguf")
    spec, download = resolve("org/elsewhere", {}, roots, KINDS, "llama-server")
    assert download == "org/elsewhere" and spec.hf == "org/elsewhere"


def test_catalog_resolve_downloads_a_snapshot_a_download_left_without_the_model(
    roots: Roots,
) -> None:
    """A snapshot directory without the GGUF (a download under way or cut short) is not the
    model: it is downloaded (huggingface_hub resumes what is there)."""
    assert roots.hf_home is not None
    (roots.hf_home / "hub" / "models--org--partial" / "snapshots" / "abc").mkdir(parents=True)
    spec, download = resolve("org/partial", {}, roots, KINDS, "llama-server")
    assert download == "org/partial" and spec.path is None


def test_catalog_resolve_known_repo_whose_download_failed_is_downloaded_again(
    roots: Roots,
) -> None:
    """A llama-server model known only by its repo (an earlier download failed or was
    cancelled, or a models-file entry with just `hf`) is downloaded, not started without
    a file; one with its file, or another engine that fetches itself, is not."""
    known = ModelSpec(id="org/elsewhere", backend="llama-server", hf="org/elsewhere")
    assert resolve("org/elsewhere", {"org/elsewhere": known}, roots, KINDS, "llama-server") == (
        known,
        "org/elsewhere",
    )
    vllm = ModelSpec(id="org/v", backend="vllm", hf="org/v")
    assert resolve("org/v", {"org/v": vllm}, roots, KINDS, "llama-server") == (vllm, None)
    on_disk = ModelSpec(id="m", backend="llama-server", path=str(roots.model_base / "llama"))
    assert resolve("m", {"m": on_disk}, roots, KINDS, "llama-server") == (on_disk, None)


def test_catalog_resolve_unknown_name_is_404(roots: Roots) -> None:
    """A name that is neither configured, a path nor a repo id is 404."""
    with pytest.raises(ModelNotFound):
        resolve("no such model", {}, roots, KINDS, "llama-server")

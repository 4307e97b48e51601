"""Weights on disk: which files count and how much they weigh."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runner.memory import ModelFiles, model_files


def _write(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)
    return path


def test_files_single_gguf(tmp_path: Path) -> None:
    """One GGUF file: its kind and size."""
    model = _write(tmp_path / "qwen-7b.Q4_K_M.gguf", 1000)
    assert model_files(model) == ModelFiles("gguf", 1000, 1)


def test_files_single_unknown_file(tmp_path: Path) -> None:
    """A file of another format has no kind."""
    model = _write(tmp_path / "model.bin", 10)
    assert model_files(model) == ModelFiles(None, 10, 1)


def test_files_directory_counts_only_safetensors(tmp_path: Path) -> None:
    """A checkpoint shipping safetensors and .bin copies counts the safetensors only."""
    _write(tmp_path / "model-00001-of-00002.safetensors", 600)
    _write(tmp_path / "model-00002-of-00002.safetensors", 400)
    _write(tmp_path / "pytorch_model.bin", 1000)
    _write(tmp_path / "tokenizer.json", 50)
    _write(tmp_path / "original" / "consolidated.00.pth", 1000)
    assert model_files(tmp_path) == ModelFiles("safetensors", 1000, 2)


def test_files_directory_of_gguf_shards(tmp_path: Path) -> None:
    """Split GGUF shards add up."""
    _write(tmp_path / "big-00001-of-00002.gguf", 700)
    _write(tmp_path / "big-00002-of-00002.gguf", 300)
    _write(tmp_path / "README.md", 5)
    assert model_files(tmp_path) == ModelFiles("gguf", 1000, 2)


def test_files_directory_of_unknown_files(tmp_path: Path) -> None:
    """No GGUF or safetensors: every file counts, kind None."""
    _write(tmp_path / "a.bin", 30)
    _write(tmp_path / "sub" / "b.pt", 20)
    assert model_files(tmp_path) == ModelFiles(None, 50, 2)


def test_files_hf_cache_symlinks_followed_once(tmp_path: Path) -> None:
    """Hugging Face cache snapshots link to blobs: the blob's size counts, once per blob."""
    blob = _write(tmp_path / "blobs" / "sha256abc", 900)
    snapshot = tmp_path / "snapshots" / "rev1"
    snapshot.mkdir(parents=True)
    os.symlink(blob, snapshot / "model.safetensors")
    os.symlink(blob, snapshot / "copy.safetensors")
    os.symlink(tmp_path / "blobs" / "missing", snapshot / "dangling.safetensors")
    assert model_files(snapshot) == ModelFiles("safetensors", 900, 1)


def test_files_missing_path_raises(tmp_path: Path) -> None:
    """A path that does not exist is an OSError, not a zero size."""
    with pytest.raises(FileNotFoundError):
        model_files(tmp_path / "nope.gguf")

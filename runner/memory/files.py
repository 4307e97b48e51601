"""What a model's weights weigh on disk: the input of the estimate chain's file-size rule.

This module reads the file system; `estimate.py` stays pure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from runner.memory.estimate import FileKind

_SUFFIXES: dict[str, FileKind] = {".gguf": "gguf", ".safetensors": "safetensors"}
_PREFERENCE: tuple[tuple[str, FileKind], ...] = ((".safetensors", "safetensors"), (".gguf", "gguf"))


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """The weights found under a model path: their kind (None: neither GGUF nor
    safetensors), total size in bytes and number of files."""

    kind: FileKind | None
    size_bytes: int
    count: int


def model_files(path: Path) -> ModelFiles:
    """The weights of the model at `path`, a file or a directory.

    1. A file → its kind by suffix and its size.
    2. A directory → every regular file under it, symlinks followed (the Hugging
       Face cache links snapshot files to blobs), each file counted once.
    3. If any are `.safetensors`, only those count (repositories often also ship
       `.bin` or `.pth` copies of the same weights); else, if any are `.gguf`, only
       those (split shards add up; an `mmproj` projector is loaded too); else all
       files count, with kind None.
    A directory holding several quantizations of one GGUF model sums them all:
    point the catalog at the one file instead.
    """
    # 1. one file
    if not path.is_dir():
        return ModelFiles(_SUFFIXES.get(path.suffix.lower()), path.stat().st_size, 1)
    # 2. every file, once
    sizes: dict[str, list[int]] = {}
    seen: set[tuple[int, int]] = set()
    for folder, _dirs, names in os.walk(path):
        for name in names:
            try:
                stat = Path(folder, name).stat()  # follows the link to the blob
            except OSError:  # dangling link, vanished file
                continue
            if (stat.st_dev, stat.st_ino) in seen:
                continue
            seen.add((stat.st_dev, stat.st_ino))
            sizes.setdefault(Path(name).suffix.lower(), []).append(stat.st_size)
    # 3. the weights of one kind
    for suffix, kind in _PREFERENCE:
        if suffix in sizes:
            return ModelFiles(kind, sum(sizes[suffix]), len(sizes[suffix]))
    every = [size for group in sizes.values() for size in group]
    return ModelFiles(None, sum(every), len(every))

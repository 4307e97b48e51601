"""LoRA adapters as the engines see them: what one is, and what its file says.

An adapter is a fine-tune served on top of a base model under a model id of its own
(`<base>:<name>` unless declared otherwise). The runner, never the client, chooses which
adapter a request runs with; the tenants bound to it (`tenants`, glob patterns) are the
only ones who may name it. How each engine applies one: llama-server loads every adapter
of its base at start (`--lora`) and takes a per-request `lora` list
(`adapters/llama_server/engine.py`); vLLM serves one by the request's `model`
(`--enable-lora`, `/v1/load_lora_adapter`, `adapters/vllm/engine.py`).

Files (read here, off the event loop by the caller):
- a GGUF adapter (llama-server): rank from the `*.lora_a` tensors' shapes in the header;
- a PEFT folder (vLLM): rank `r` from `adapter_config.json`;
- `file_digest`: a file's sha256; a folder's is the sha256 of the lines
  `<sha256 of file>  <name>` of `adapter_config.json` and `adapter_model.safetensors`
  (`(cd DIR && sha256sum adapter_config.json adapter_model.safetensors) | sha256sum`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """One adapter bound to its base model and to the tenants that may use it."""

    id: str  # the model id clients send
    name: str  # its name on the base model (the engine's name for it)
    base: str  # the base model's id
    path: str  # a GGUF file (llama-server) or a PEFT folder (vLLM)
    tenants: tuple[str, ...]  # tenant ids or glob patterns
    sha256: str | None = None
    scale: float = 1.0
    rank: int | None = None
    size_mb: float = 0.0
    governed: bool = False  # loaded by a governed adapter-load, not the models file

    @property
    def cache_key(self) -> str:
        """What a cached prompt state computed with this adapter is filed under: its id and
        the start of its digest, so a changed adapter never restores another's state."""
        return f"{self.id}@{(self.sha256 or '')[:16]}"

    def allows(self, tenant: str) -> bool:
        return tenant_matches(self.tenants, tenant)


def tenant_matches(patterns: Sequence[str], tenant: str) -> bool:
    """`tenant` is one of `patterns` (exact ids, or globs with `*` / `?`)."""
    return any(p == tenant or fnmatch.fnmatchcase(tenant, p) for p in patterns)


def file_digest(path: Path) -> str:
    """The sha256 the runner binds an adapter to (module docstring)."""
    if not path.is_dir():
        return _sha256(path)
    lines = "".join(f"{_sha256(path / name)}  {name}\n" for name in PEFT_FILES)
    return hashlib.sha256(lines.encode()).hexdigest()


def size_mb(path: Path) -> float:
    """The adapter's weights on disk, in MB (what it adds to its engine's memory)."""
    files = [path / PEFT_FILES[1]] if path.is_dir() else [path]
    return round(sum(f.stat().st_size for f in files if f.exists()) / 2**20, 1)


def read_rank(path: Path) -> int | None:
    """The adapter's rank, from its files (None when they do not say)."""
    if path.is_dir():
        try:
            config = json.loads((path / PEFT_FILES[0]).read_text())
        except (OSError, ValueError):
            return None
        r = config.get("r") if isinstance(config, dict) else None
        return r if isinstance(r, int) and r > 0 else None
    try:
        with path.open("rb") as f:
            return _gguf_rank(f)
    except (OSError, ValueError, struct.error):
        return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# GGUF metadata value types (ggml's gguf.h): their sizes, strings and arrays apart.
_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def _gguf_rank(f: BinaryIO) -> int | None:
    """Walk a GGUF header (magic, version, counts, metadata, tensor infos) to the first
    `*.lora_a` tensor: its smaller dimension is the rank."""
    if f.read(4) != b"GGUF":
        raise ValueError("not a GGUF file")
    (version,) = struct.unpack("<I", f.read(4))
    if version < 2:
        raise ValueError(f"GGUF version {version} is not read")
    n_tensors, n_kv = struct.unpack("<QQ", f.read(16))
    for _ in range(n_kv):
        _string(f)
        (kind,) = struct.unpack("<I", f.read(4))
        _skip_value(f, kind)
    for _ in range(n_tensors):
        name = _string(f)
        (n_dims,) = struct.unpack("<I", f.read(4))
        dims = struct.unpack(f"<{n_dims}Q", f.read(8 * n_dims))
        f.read(12)  # type (u32) and offset (u64)
        if name.endswith(".lora_a") and dims:
            return int(min(dims))
    return None


def _string(f: BinaryIO) -> str:
    (n,) = struct.unpack("<Q", f.read(8))
    if n > 1 << 20:
        raise ValueError("GGUF string too long")
    return f.read(n).decode("utf-8", "replace")


def _skip_value(f: BinaryIO, kind: int) -> None:
    if kind in _SCALARS:
        f.read(_SCALARS[kind])
    elif kind == _STRING:
        _string(f)
    elif kind == _ARRAY:
        (inner,) = struct.unpack("<I", f.read(4))
        (count,) = struct.unpack("<Q", f.read(8))
        if inner in _SCALARS:
            f.read(_SCALARS[inner] * count)
        else:
            for _ in range(count):
                _skip_value(f, inner)
    else:
        raise ValueError(f"unknown GGUF value type {kind}")

"""adapters.lora: an adapter's tenants, digest, rank and size, read from its files (a real
GGUF adapter: tests/runner/lifecycle/test_adapter_ops_llama_real.py)."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest

from adapters.http_client import EngineConnections
from adapters.lora import LoraAdapter, file_digest, read_rank, size_mb, tenant_matches
from adapters.openai.engine import AttachedOpenAIEngine

pytestmark = pytest.mark.timeout(10)


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _gguf(path: Path, rank: int) -> None:
    """A GGUF header as convert_lora_to_gguf.py writes one: metadata (a string, a float, an
    array of strings), then tensor infos, a `lora_a` of [in, rank] among them."""
    kv = _string("general.type") + struct.pack("<I", 8) + _string("adapter")
    kv += _string("adapter.lora.alpha") + struct.pack("<If", 6, 16.0)
    kv += _string("tags") + struct.pack("<IIQ", 9, 8, 2) + _string("x") + _string("yz")
    tensors = b""
    for name, dims in (("blk.0.attn_q.weight.lora_b", (rank, 1024)),
                       ("blk.0.attn_q.weight.lora_a", (640, rank))):  # fmt: skip
        tensors += _string(name) + struct.pack("<I", 2) + struct.pack("<QQ", *dims)
        tensors += struct.pack("<IQ", 1, 0)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2, 3) + kv + tensors + b"\0" * 64)


def test_rank_from_a_gguf_adapter_and_a_peft_folder(tmp_path: Path) -> None:
    """The rank is the smaller dimension of a GGUF adapter's first `lora_a` tensor, or a
    PEFT folder's `r`; an unreadable file says nothing."""
    _gguf(tmp_path / "a.gguf", 8)
    assert read_rank(tmp_path / "a.gguf") == 8
    folder = tmp_path / "peft"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 16}))
    assert read_rank(folder) == 16
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf")
    assert read_rank(tmp_path / "junk.gguf") is None


def test_digest_of_a_file_and_of_a_peft_folder(tmp_path: Path) -> None:
    """A file's digest is its sha256; a folder's the sha256 of `sha256sum`'s lines for its
    config and weights (the command docs/engines.md gives)."""
    (tmp_path / "a.gguf").write_bytes(b"weights")
    assert file_digest(tmp_path / "a.gguf") == hashlib.sha256(b"weights").hexdigest()
    folder = tmp_path / "peft"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    (folder / "adapter_model.safetensors").write_bytes(b"w" * 2**20)
    lines = "".join(
        f"{hashlib.sha256((folder / n).read_bytes()).hexdigest()}  {n}\n"
        for n in ("adapter_config.json", "adapter_model.safetensors")
    )
    assert file_digest(folder) == hashlib.sha256(lines.encode()).hexdigest()
    assert size_mb(folder) == 1.0


def test_tenants_bound_by_id_or_pattern() -> None:
    """An adapter allows the tenants it lists, exactly or by glob pattern, and no other;
    its cache key changes with its file."""
    adapter = LoraAdapter("m:a", "a", "m", "/x", ("team-a", "ops-*"), sha256="ab" * 32)
    assert adapter.allows("team-a") and adapter.allows("ops-eu")
    assert not adapter.allows("team-b") and not adapter.allows("team-a2")
    assert tenant_matches(["*"], "anyone")
    other = LoraAdapter("m:a", "a", "m", "/x", ("*",), sha256="cd" * 32)
    assert adapter.cache_key != other.cache_key


def test_an_attached_engine_never_takes_a_clients_adapter_choice() -> None:
    """An engine attached by URL (a llama-server the runner cannot see into) gets no
    client-sent `lora`, isolated or not."""
    http = EngineConnections("http://127.0.0.1:9", 1.0, 1.0)
    for isolation in ("none", "cache_prompt_off"):
        engine = AttachedOpenAIEngine("m", "http://127.0.0.1:9", 1, http, isolation)
        body = {"prompt": "x", "lora": [{"id": 0, "scale": 1.0}]}
        assert engine.rewrite(body, "default", "t") and "lora" not in body
    assert not AttachedOpenAIEngine("m", "http://127.0.0.1:9", 1, http).rewrite({}, "d", "t")

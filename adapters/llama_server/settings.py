"""The llama-server kind's settings (adapters/kind_settings.py): `LLAMA_SERVER_BIN`,
`LLAMA_SLOT_CACHE_ENTRIES` and the saved prompt states' `PREFIX_CACHE_*`
(docs/configuration.md); only this kind saves prompt states."""

from __future__ import annotations

import os

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from adapters.kind_settings import KindSettings


def default_prefix_cache_dir() -> str:
    """Where saved prompt states outlive their engine (QUORUM_CACHE, else ~/.cache/quorum)."""
    cache = os.environ.get("QUORUM_CACHE") or os.path.expanduser("~/.cache/quorum")
    return os.path.join(cache, "prefixes")


class LlamaServerSettings(KindSettings):
    """The llama-server executable, its slot states and the saved prompt states."""

    model_config = SettingsConfigDict(env_prefix="")

    llama_server_bin: str | None = None  # None: the kind's own build (scripts/install)
    llama_slot_cache_entries: int = Field(default=64, ge=0, le=100_000)
    prefix_cache_dir: str = Field(default_factory=lambda: default_prefix_cache_dir())
    prefix_cache_persist: bool = True  # false: a private folder per engine, removed with it
    prefix_cache_max_mb: int = Field(default=2048, ge=1)  # per model folder
    prefix_cache_ttl_s: float = Field(default=86_400.0, gt=0)  # unused this long: removed

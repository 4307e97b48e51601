"""The `cache_salt` the runner sends vLLM for each tenant and tag, and its rotation.

vLLM mixes a request's `cache_salt` into the hash of the prompt's first KV block
(`vllm/v1/core/kv_cache_utils.py`, `generate_block_hash_extra_keys`: the extra key
`("cache_salt", salt)` when `start_token_idx == 0`), so every later block hash of the
prompt depends on it: only requests with the same salt share cached blocks, and unsalted
requests share with each other. The salt is therefore a capability: whoever knows it can
probe that cache. The runner derives it from a per-runner secret and never takes it from
a client:

    salt = base64url(HMAC-SHA256(secret, tenant "\\0" tag "\\0" generation))   (43 chars)

base64url, not base64: vLLM refuses a salt with `/`, `@`, `\\` or NUL, or longer than 128
characters (`vllm/entrypoints/generate/base/protocol.py`, `validate_cache_salt`).

Rotation is how a `tenant` or `tag` flush works on vLLM, which cannot drop the blocks of
one salt: bumping the generation makes a new salt, so nothing cached under the old one can
be hit again; vLLM evicts the orphaned blocks as it needs the memory. A `tenant` flush
rotates every salt of that tenant (all its tags); a `tag` flush the salt of that tag (of
one tenant, or of every tenant when none is named).

Pure state, no I/O, no clock. `CacheSalts.salt` is on the hot path: it memoises the
current salt per (tenant, tag).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_TRACKED = 65_536
"""Distinct (tenant, tag) salts remembered for counting a flush; older ones are forgotten
(their salts still rotate, they are only left out of `entriesRemoved`)."""


def derive_salt(secret: bytes, tenant: str, tag: str | None, generation: str) -> str:
    """The salt for one tenant/tag/generation: 43 base64url characters, no padding."""
    message = b"\0".join((tenant.encode(), (tag or "").encode(), generation.encode()))
    digest = hmac.new(secret, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


@dataclass
class CacheSalts:
    """Current salts per (tenant, tag) and the generations that rotate them."""

    secret: bytes
    _tenant_gen: dict[str, int] = field(default_factory=dict)
    _tag_gen: dict[str, int] = field(default_factory=dict)
    _pair_gen: dict[tuple[str, str], int] = field(default_factory=dict)
    _current: dict[tuple[str, str | None], tuple[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.secret) < 16:
            raise ValueError("the cache-salt secret must be at least 16 bytes")

    def generation(self, tenant: str, tag: str | None) -> str:
        """The generation string of (tenant, tag): tenant, tag and pair counters."""
        if tag is None:
            return str(self._tenant_gen.get(tenant, 0))
        return (
            f"{self._tenant_gen.get(tenant, 0)}.{self._tag_gen.get(tag, 0)}"
            f".{self._pair_gen.get((tenant, tag), 0)}"
        )

    def salt(self, tenant: str, tag: str | None) -> str:
        """The salt to send for a request of `tenant` with cache tag `tag`."""
        key = (tenant, tag)
        gen = self.generation(tenant, tag)
        known = self._current.get(key)
        if known is not None and known[0] == gen:
            return known[1]
        salt = derive_salt(self.secret, tenant, tag, gen)
        if known is None and len(self._current) >= MAX_TRACKED:
            del self._current[next(iter(self._current))]
        self._current[key] = (gen, salt)
        return salt

    def rotate_tenant(self, tenant: str) -> int:
        """New salts for every tag of `tenant`; returns how many salts in use were rotated."""
        self._tenant_gen[tenant] = self._tenant_gen.get(tenant, 0) + 1
        return self._forget(lambda t, _: t == tenant)

    def rotate_tag(self, tag: str, tenant: str | None = None) -> int:
        """New salt for `tag` (of `tenant`, or of every tenant); returns salts rotated."""
        if tenant is None:
            self._tag_gen[tag] = self._tag_gen.get(tag, 0) + 1
            return self._forget(lambda _, g: g == tag)
        self._pair_gen[(tenant, tag)] = self._pair_gen.get((tenant, tag), 0) + 1
        return self._forget(lambda t, g: t == tenant and g == tag)

    def _forget(self, match: Callable[[str, str | None], bool]) -> int:
        gone = [k for k in self._current if match(k[0], k[1])]
        for k in gone:
            del self._current[k]
        return len(gone)

"""Cache salts per tenant and tag, and their rotation (adapters/vllm/salts.py)."""

from __future__ import annotations

import pytest

from adapters.vllm.salts import CacheSalts, derive_salt

SECRET = b"s" * 32


def test_derive_salt_is_base64url_vllm_accepts() -> None:
    """A salt is 43 base64url characters: none of the `/ @ \\ NUL` vLLM refuses."""
    salt = derive_salt(SECRET, "tenant", "tag", "0")
    assert len(salt) == 43
    assert not set(salt) & set("/@\\\0=+")


def test_cache_salts_differ_by_tenant_tag_and_secret() -> None:
    """Tenants, tags and runners (secrets) each get their own salt; the same key is stable."""
    salts = CacheSalts(SECRET)
    a, b = salts.salt("a", None), salts.salt("b", None)
    assert a != b and salts.salt("a", None) == a
    assert salts.salt("a", "t") not in (a, b)
    assert CacheSalts(b"x" * 32).salt("a", None) != a


def test_cache_salts_tenant_rotation_changes_all_its_salts() -> None:
    """A tenant flush gives the tenant (and each of its tags) a new salt, others keep theirs."""
    salts = CacheSalts(SECRET)
    old = [salts.salt("a", None), salts.salt("a", "t"), salts.salt("b", None)]
    assert salts.rotate_tenant("a") == 2
    assert salts.salt("a", None) != old[0]
    assert salts.salt("a", "t") != old[1]
    assert salts.salt("b", None) == old[2]


def test_cache_salts_tag_rotation_of_one_tenant_or_all() -> None:
    """A tag flush with a tenant rotates that pair; without one, the tag for every tenant."""
    salts = CacheSalts(SECRET)
    a_t, b_t, a = salts.salt("a", "t"), salts.salt("b", "t"), salts.salt("a", None)
    assert salts.rotate_tag("t", "a") == 1
    assert salts.salt("a", "t") != a_t and salts.salt("b", "t") == b_t
    assert salts.salt("a", None) == a
    assert salts.rotate_tag("t") == 2
    assert salts.salt("b", "t") != b_t


def test_cache_salts_rotation_of_an_unused_salt_counts_zero() -> None:
    """A flush of a tenant that sent nothing since the last one rotates no salt in use."""
    assert CacheSalts(SECRET).rotate_tenant("nobody") == 0


def test_cache_salts_refuse_a_short_secret() -> None:
    """A secret under 16 bytes is refused: the salts would be guessable."""
    with pytest.raises(ValueError):
        CacheSalts(b"short")

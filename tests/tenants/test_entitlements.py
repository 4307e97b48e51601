"""`tenants.policy.Entitlements`, compiled once: a model is allowed exactly when one of
the tenant's ids or glob patterns matches it as `fnmatchcase` would."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenants.policy import Entitlements

pytestmark = pytest.mark.timeout(60)

_PIECES = ("gemma", "-", "3", "*", "?", "[ab]", "[!a]", "a", "b", ".", ":", "!", "]", "smol")
patterns = st.lists(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=5).map("".join))
models = st.lists(st.sampled_from(("gemma", "-", "3", "a", "b", ".", ":", "!", "]", "smol", "x")),
                  min_size=1, max_size=6).map("".join)  # fmt: skip


@given(patterns=patterns, model=models)
def test_entitlements_allow_what_fnmatchcase_matches(patterns: list[str], model: str) -> None:
    """Ids, globs, character classes and literal `!`/`]` decide as `fnmatchcase` does."""
    entitled = Entitlements(tuple(patterns))
    assert entitled.allows(model) == any(fnmatchcase(model, p) for p in patterns)


def test_entitlements_none_allows_every_model_and_empty_allows_none() -> None:
    """No list: every model; an empty list: none; equality is by the patterns alone."""
    assert Entitlements().allows("anything")
    assert not Entitlements(()).allows("anything")
    assert Entitlements(("a*", "b")) == Entitlements(("a*", "b"))
    assert Entitlements(("gemma-*", "echo")).filter(["echo", "gemma-3", "smol"]) == [
        "echo",
        "gemma-3",
    ]

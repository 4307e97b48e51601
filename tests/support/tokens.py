"""Governance tokens signed in-process with the development keys in keys/ (tests only)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from governance.signing import combine, load_private_key, propose, sign
from tests.support.runner_proc import REPO_ROOT

KEYS = REPO_ROOT / "keys"
DEV_REGISTRY = KEYS / "registry.dev.json"


def dev_token(
    operation: str,
    model_id: str | None,
    params: Mapping[str, object],
    aud: str = "test-runner",
    signers: Sequence[str] = ("admin1", "admin2"),
) -> dict[str, Any]:
    """A token approved by `signers` for exactly this operation, model and params."""
    proposal = propose(
        operation=operation,
        model_id=model_id,
        params=params,
        aud=aud,
        iss="gov-dev",
        issued_at=int(time.time()),
    )
    keys = [load_private_key((KEYS / f"{name}.key").read_bytes()) for name in signers]
    return combine(sign(proposal, key) for key in keys)

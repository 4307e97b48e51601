"""Governance tokens signed in-process with the development keys in keys/ (tests only)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from governance.signing import combine, load_private_key, propose, sign
from tests.support.runner_proc import REPO_ROOT

KEYS = REPO_ROOT / "keys"
DEV_REGISTRY = KEYS / "registry.dev.json"
DEV_AUDIT_KEY = KEYS / "audit.dev.key"


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


ADMIN_KEY = "ops-admin-key-0123456789abcdef0123456789"
"""The API key of tenant `ops`, the admin of test runners in keys mode (`admin_env`)."""
FAIRNESS = "x-llm-d-inference-fairness-id"


def admin_env(directory: Path, **keys: str) -> dict[str, str]:
    """Settings of a runner whose admin `ops` signs in with ADMIN_KEY (keys mode), plus the
    tenants `keys` names (tenant -> key): ADMIN_TENANTS needs keys or a gateway."""
    path = directory / "tenants.yaml"
    tenants = {"ops": ADMIN_KEY, **keys}
    path.write_text(
        "tenants:\n" + "".join(f"  {t}:\n    api_keys: ['{k}']\n" for t, k in tenants.items())
    )
    return {"ADMIN_TENANTS": "ops", "TENANTS_FILE": str(path)}


def gateway_env(admin: str = "ops") -> dict[str, str]:
    """Settings of a runner behind a gateway whose admin is `admin` (send FAIRNESS: it); the
    gateway is the tests' own loopback address (gateway mode needs GATEWAY_PEERS or
    GATEWAY_SECRET)."""
    return {"TENANT_IDENTITY": "gateway", "ADMIN_TENANTS": admin, "GATEWAY_PEERS": "127.0.0.1"}

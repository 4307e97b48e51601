"""The status page's document and who may read it (pure, and the auth seam in process)."""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.requests import Request

from runner.errors import Forbidden
from runner.http.status_page import LoginRequired, page_admin
from runner.telemetry.status_view import (
    LoadRow,
    ModelRow,
    PageInputs,
    Waiting,
    audit_row,
    page_state,
)
from tenants.config import parse_tenants_file
from tenants.errors import MissingApiKey, MissingGatewayIdentity, TenantMismatch
from tenants.identity import Identity, IdentityMode


def inputs(**changes: Any) -> PageInputs:
    base: dict[str, Any] = {
        "runner_id": "r1",
        "life": "ready",
        "uptime_s": 12.4,
        "memory_total_mb": 1000,
        "memory_used_mb": 400,
        "memory_free_mb": 600,
        "memory_source": "budget",
        "models": [
            ModelRow(
                "b",
                "llama-server",
                "failed",
                0,
                None,
                None,
                None,
                2,
                137,
                "engine exited (signal 9)\nlast log: user said SECRET",
                None,
            ),
            ModelRow("a", "llama-server", "ready", 300, 250, 50, 0.5, 0, None, None, 1),
        ],
        "loads": [LoadRow("load-2", "c", "loading", 0.25, 3.0, 95.0)],
        "queue_depth": 3,
        "queue_max_depth": 16,
        "avg_wait_ms": 10,
        "p95_wait_ms": 40,
        "in_flight": {"a": 1, "b": 0},
        "waiting": [
            Waiting("acme", "low", "a"),
            Waiting("acme", "low", "a"),
            Waiting("zed", "high", "a"),
        ],
        "audit": [],
        "audit_source": "memory",
        "now": 100.0,
    }
    return PageInputs(**{**base, **changes})


def test_page_state_models_loads_and_queues() -> None:
    """Models in name order with memory split and restarts; a failed model shows only the
    first line of its reason; queues are counts per tenant and priority."""
    doc = page_state(inputs())
    assert [m["id"] for m in doc["models"]] == ["a", "b"]
    a, b = doc["models"]
    assert (a["weightsMB"], a["kvMB"], a["restarts"]) == (250, 50, 0)
    assert (b["state"], b["exitCode"], b["restarts"]) == ("failed", 137, 2)
    assert b["error"] == "engine exited (signal 9)"
    assert doc["loads"] == [
        {
            "taskId": "load-2",
            "modelId": "c",
            "status": "loading",
            "progress": 0.25,
            "eta": 3.0,
            "ageS": 5.0,
        }
    ]
    queues = doc["queues"]
    assert queues["byTenant"] == [
        {"tenant": "acme", "high": 0, "normal": 0, "low": 2},
        {"tenant": "zed", "high": 1, "normal": 0, "low": 0},
    ]
    assert queues["byPriority"] == {"high": 1, "normal": 0, "low": 2}
    assert queues["inFlight"] == {"a": 1}
    assert "SECRET" not in repr(doc)


def test_audit_row_names_signers_never_nonces() -> None:
    """A decision shows operation, model, fields, outcome, principals and short key ids;
    the nonce's hash and the detail are not shown."""
    record = {
        "time": 5.0,
        "runner_id": "r1",
        "operation": "model-load",
        "model_id": "m",
        "params": {"maxContextLength": 512},
        "outcome": "approved",
        "reason": "ok",
        "status": 200,
        "principals": ["admin1", "admin2"],
        "key_ids": ["ab" * 32, "cd" * 32],
        "nonce_sha256": "ef" * 32,
        "detail": "",
        "extra": {},
    }
    row = audit_row(record)
    assert row["principals"] == ["admin1", "admin2"]
    assert row["keyIds"] == ["abababababab", "cdcdcdcdcdcd"]
    assert "ef" * 32 not in repr(row) and "nonce" not in repr(row)
    newest_first = page_state(inputs(audit=[record, {**record, "operation": "model-unload"}]))
    decisions = newest_first["audit"]["decisions"]
    assert [d["operation"] for d in decisions] == ["model-unload", "model-load"]


def _request(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "GET", "path": "/ui", "headers": raw})


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


OPS_KEY = "ops-key-0123456789abcdef0123456789abcd"
ACME_KEY = "acme-key-0123456789abcdef0123456789abc"
KEYED = parse_tenants_file(
    f"tenants:\n  ops:\n    api_keys: [{OPS_KEY}]\n  acme:\n    api_keys: [{ACME_KEY}]\n",
    "t.yaml",
)
FAIRNESS = "x-llm-d-inference-fairness-id"


class _Runtime:
    """What `page_admin` reads of the Runtime: the identity and the admins."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self.settings = SimpleNamespace(admins=frozenset({"ops"}), objectives={})

    def identify(self, scope: Any) -> str:
        from runner.runtime.wiring import Runtime

        return Runtime.identify(self, scope)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mode", "headers", "outcome"),
    [
        ("keys", {}, LoginRequired),
        ("keys", {"Authorization": "Basic !!"}, LoginRequired),
        ("keys", _basic("ops", OPS_KEY), "ops"),
        ("keys", _basic("ops", "wrong"), LoginRequired),
        ("keys", _basic("ops", ""), LoginRequired),
        ("keys", _basic("ops", ACME_KEY), TenantMismatch),
        ("keys", {"Authorization": f"Bearer {ACME_KEY}"}, Forbidden),
        ("keys", {"Authorization": f"Bearer {OPS_KEY}"}, "ops"),
        ("keys", {"X-Tenant-ID": "ops"}, MissingApiKey),
        ("gateway", {FAIRNESS: "ops"}, "ops"),
        ("gateway", {FAIRNESS: "acme"}, Forbidden),
        ("gateway", {"X-Tenant-ID": "ops"}, MissingGatewayIdentity),
        ("gateway", _basic("ops", OPS_KEY), MissingGatewayIdentity),
    ],
)
def test_page_admin_identifies_like_inference_or_by_basic(
    mode: str, headers: dict[str, str], outcome: object
) -> None:
    """Admins pass by the one identity (API key, or the gateway's fairness id), or in keys
    mode by HTTP Basic (tenant, key); no identity in keys mode is a 401 challenge, a bad
    Basic key another one, a non-admin 403; X-Tenant-ID alone names no one."""
    rt = _Runtime(Identity(KEYED, IdentityMode(mode)))
    if isinstance(outcome, str):
        assert page_admin(rt, _request(headers)) == outcome  # type: ignore[arg-type]
    else:
        assert isinstance(outcome, type)
        with pytest.raises(outcome) as raised:
            page_admin(rt, _request(headers))  # type: ignore[arg-type]
        if outcome is LoginRequired:
            assert raised.value.headers["WWW-Authenticate"].startswith("Basic realm=")

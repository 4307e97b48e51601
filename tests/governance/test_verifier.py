"""Accepted tokens, replay, nonce discipline, legacy mode, registry expiry, audit contents."""

from __future__ import annotations

import itertools
import json

import pytest

from governance import signing
from governance.errors import GovernanceError
from tests.governance.support import (
    A1,
    A1_NEW,
    A2,
    A3,
    LEGACY_KEY,
    MODEL,
    NOW,
    OPERATION,
    PARAMS,
    RUNNER,
    Clock,
    claims,
    flip_bit,
    header,
    make_verifier,
    registry_doc,
    token,
)

QUORUMS = [p for n in (2, 3) for p in itertools.permutations((A1, A2, A3), n)]


@pytest.mark.parametrize("keys", QUORUMS, ids=[f"q{i}" for i in range(len(QUORUMS))])
async def test_verifier_accepts_quorum_in_any_order(keys: tuple[object, ...]) -> None:
    """Any 2 or 3 distinct principals, in any signature order, approve a 2-of-3 load."""
    verifier, nonces, audit = make_verifier()
    approval = await verifier.authorize(token(keys=keys), OPERATION, MODEL, dict(PARAMS))  # type: ignore[arg-type]
    assert approval.principals == tuple(sorted(approval.principals))
    assert len(approval.principals) == len(keys)
    assert (approval.operation, approval.model_id, approval.params) == (OPERATION, MODEL, PARAMS)
    assert len(nonces) == 1 and audit.records[-1].outcome == "approved"


async def test_verifier_accepts_rotated_key() -> None:
    """A principal's second (rotated) key counts for that principal."""
    verifier, _, _ = make_verifier()
    approval = await verifier.authorize(token(keys=(A1_NEW, A2)), OPERATION, MODEL, PARAMS)
    assert approval.principals == ("admin1", "admin2")
    assert approval.key_ids == (signing.kid_of(A1_NEW), signing.kid_of(A2))


@pytest.mark.parametrize("form", ["object", "json-text", "base64url"])
async def test_verifier_accepts_every_transport_form(form: str) -> None:
    """The token may arrive as a JSON object, as JSON text, or base64url ('eyJ...')."""
    doc = token()
    raw = {"object": doc, "json-text": json.dumps(doc), "base64url": signing.to_b64(doc)}[form]
    verifier, _, _ = make_verifier()
    assert (await verifier.authorize(raw, OPERATION, MODEL, PARAMS)).principals


async def test_verifier_params_compare_by_value_not_key_order() -> None:
    """Request params in another key order still match the signed params."""
    body = claims(params={"a": 1, "b": {"y": [1, 2], "x": None}})
    verifier, _, _ = make_verifier()
    approval = await verifier.authorize(
        token(body), OPERATION, MODEL, {"b": {"x": None, "y": [1, 2]}, "a": 1}
    )
    assert approval.params == {"b": {"x": None, "y": [1, 2]}, "a": 1}


async def test_verifier_replay_is_409() -> None:
    """The same token twice: the second call gets 409 nonce_replayed."""
    verifier, _, audit = make_verifier()
    doc = token()
    await verifier.authorize(doc, OPERATION, MODEL, PARAMS)
    with pytest.raises(GovernanceError) as info:
        await verifier.authorize(doc, OPERATION, MODEL, PARAMS)
    assert (info.value.status, info.value.code) == (409, "nonce_replayed")
    assert [r.reason for r in audit.records] == ["ok", "nonce_replayed"]


async def test_verifier_replay_at_last_valid_second_is_409() -> None:
    """The nonce is kept as long as the token could pass the time checks."""
    clock = Clock()
    verifier, _, _ = make_verifier(clock)
    doc = token()
    await verifier.authorize(doc, OPERATION, MODEL, PARAMS)
    clock.advance(329)
    with pytest.raises(GovernanceError) as info:
        await verifier.authorize(doc, OPERATION, MODEL, PARAMS)
    assert info.value.status == 409
    clock.advance(1)
    with pytest.raises(GovernanceError) as info:
        await verifier.authorize(doc, OPERATION, MODEL, PARAMS)
    assert info.value.status == 401


async def test_verifier_forged_token_never_burns_nonce() -> None:
    """A forged token carrying a real nonce is refused without spending that nonce."""
    verifier, nonces, _ = make_verifier()
    body = claims()
    forged = token(body)
    forged["signatures"][1]["signature"] = flip_bit(forged["signatures"][1]["signature"])
    with pytest.raises(GovernanceError) as info:
        await verifier.authorize(forged, OPERATION, MODEL, PARAMS)
    assert info.value.status == 401 and len(nonces) == 0
    assert (await verifier.authorize(token(body), OPERATION, MODEL, PARAMS)).principals


async def test_verifier_misbound_token_does_not_burn_nonce() -> None:
    """A genuine token presented for the wrong request leaves its nonce usable."""
    verifier, nonces, _ = make_verifier()
    doc = token()
    with pytest.raises(GovernanceError):
        await verifier.authorize(doc, OPERATION, "other/model", PARAMS)
    assert len(nonces) == 0
    assert (await verifier.authorize(doc, OPERATION, MODEL, PARAMS)).principals


async def test_verifier_legacy_counts_as_one_principal() -> None:
    """A legacy HMAC flush token is accepted where allowed and counts as one principal."""
    verifier, _, _ = make_verifier(legacy_key=LEGACY_KEY)
    body = claims(
        operation="cache-flush",
        modelId=None,
        params={"scope": "all"},
        signers=["admin1", "admin2", "admin3"],
    )
    approval = await verifier.authorize(
        signing.sign_legacy(body, LEGACY_KEY), "cache-flush", None, {"scope": "all"}
    )
    assert approval.principals == ("legacy-hmac",) and approval.legacy
    assert approval.key_ids == ()


async def test_verifier_legacy_seed_shape_goes_through_time_and_nonce() -> None:
    """A seed-shaped legacy token (no aud/iss/expiresAt) is time-checked and replay-proof."""
    clock = Clock()
    verifier, _, _ = make_verifier(clock, legacy_key=LEGACY_KEY)
    body = {
        "operation": "cache-flush",
        "modelId": None,
        "issuedAt": NOW,
        "signers": ["admin1"],
        "nonce": "seed-style-nonce-0123456789",
    }
    doc = signing.sign_legacy(body, LEGACY_KEY)
    assert (await verifier.authorize(doc, "cache-flush", None, {})).legacy
    with pytest.raises(GovernanceError) as info:
        await verifier.authorize(doc, "cache-flush", None, {})
    assert info.value.status == 409
    clock.advance(400)
    fresh = signing.sign_legacy({**body, "nonce": "seed-style-nonce-abcdefghij"}, LEGACY_KEY)
    with pytest.raises(GovernanceError) as info:
        await verifier.authorize(fresh, "cache-flush", None, {})
    assert info.value.status == 401


async def test_verifier_expired_registry_is_503_on_every_call() -> None:
    """Once the registry expires, valid and garbage tokens alike get 503 registry_expired."""
    clock = Clock(NOW)
    verifier, nonces, audit = make_verifier(clock, expires="2026-01-01T00:00:00Z")
    for raw in (token(), "garbage"):
        with pytest.raises(GovernanceError) as info:
            await verifier.authorize(raw, OPERATION, MODEL, PARAMS)
        assert (info.value.status, info.value.code) == (503, "registry_expired")
        assert info.value.headers["Retry-After"]
    assert len(nonces) == 0 and len(audit.records) == 2


async def test_verifier_operation_missing_from_registry_is_403() -> None:
    """An operation the registry does not list can be approved by nobody."""
    ops = registry_doc()["operations"]
    del ops["task-cancel"]
    verifier, _, _ = make_verifier(operations=ops)
    body = claims(operation="task-cancel", modelId=None, params={"taskId": "t"})
    with pytest.raises(GovernanceError) as info:
        await verifier.authorize(token(body), "task-cancel", None, {"taskId": "t"})
    assert (info.value.status, info.value.code) == (403, "threshold_not_met")


async def test_verifier_signer_outside_operation_does_not_count() -> None:
    """A registered principal not allowed for the operation neither counts nor rejects."""
    verifier, _, _ = make_verifier()
    body = claims(operation="task-cancel", modelId=None, params={"taskId": "t"})
    approval = await verifier.authorize(
        token(body, keys=(A2, A1)), "task-cancel", None, {"taskId": "t"}
    )
    assert approval.principals == ("admin1", "admin2")


async def test_verifier_audit_record_has_no_secrets() -> None:
    """The approval record names principals, key ids and a nonce hash, never token material."""
    verifier, _, audit = make_verifier()
    body = claims()
    doc = token(body)
    await verifier.authorize(doc, OPERATION, MODEL, PARAMS)
    [record] = audit.records
    line = record.to_json()
    assert record.principals == ("admin1", "admin2") and record.runner_id == RUNNER
    assert record.nonce_sha256 and len(record.nonce_sha256) == 64
    for secret in (body["nonce"], doc["payload"], doc["signatures"][0]["signature"]):
        assert secret not in line


def test_verifier_refuses_short_legacy_key() -> None:
    """A legacy HMAC key under 32 bytes is refused at construction."""
    with pytest.raises(ValueError):
        make_verifier(legacy_key=b"short")


def test_header_helper_matches_signing() -> None:
    """The test kit's header is exactly what governance.signing produces."""
    signed = signing.sign(
        signing.propose(
            operation=OPERATION, model_id=MODEL, params=PARAMS, aud=RUNNER, iss="x", issued_at=NOW
        ),
        A1,
    )
    from governance.encoding import b64url_decode

    assert json.loads(b64url_decode(signed["signatures"][0]["protected"])) == header(A1)

"""Table of malformed and malicious tokens, each with the exact status and code it must get."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from governance import signing
from governance.encoding import b64url_encode, canonical
from governance.errors import GovernanceError
from tests.governance.support import (
    A1,
    A1_NEW,
    A2,
    A3,
    DROP,
    LEGACY_KEY,
    MODEL,
    NOW,
    OPERATION,
    OUTSIDER,
    PARAMS,
    claims,
    entry,
    flip_bit,
    header,
    make_verifier,
    payload_of,
    token,
)


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[], object]
    status: int
    code: str
    operation: str = OPERATION
    model: str | None = MODEL
    params: dict[str, object] = field(default_factory=lambda: dict(PARAMS))
    legacy_key: bytes | None = None


def with_payload(raw: bytes) -> dict[str, object]:
    """A token whose payload bytes are exactly `raw`, validly signed by two principals."""
    return token(raw)


def claims_bytes(**overrides: object) -> bytes:
    return canonical(claims(**overrides))


def replace_in_claims(old: bytes, new: bytes) -> dict[str, object]:
    raw = claims_bytes()
    assert old in raw
    return with_payload(raw.replace(old, new, 1))


def forged_header(**overrides: object) -> dict[str, object]:
    """Two entries; the first carries a tampered (but validly signed) protected header."""
    payload = payload_of(claims())
    return {
        "payload": payload,
        "signatures": [entry(A1, payload, header(A1, **overrides)), entry(A2, payload)],
    }


def with_protected(protected: str) -> dict[str, object]:
    payload = payload_of(claims())
    return {
        "payload": payload,
        "signatures": [entry(A1, payload, protected=protected), entry(A2, payload)],
    }


def tamper_signature(change: Callable[[str], str]) -> dict[str, object]:
    doc = token()
    doc["signatures"][0]["signature"] = change(doc["signatures"][0]["signature"])
    return doc


def legacy(body: dict[str, object], key: bytes = LEGACY_KEY) -> dict[str, object]:
    return signing.sign_legacy(body, key)


def with_field(doc: dict[str, object], **extra: object) -> dict[str, object]:
    return {**doc, **extra}


def stolen_signature() -> dict[str, object]:
    """A valid signature lifted from another token onto this payload."""
    other, doc = token(), token()
    doc["signatures"][0]["signature"] = other["signatures"][0]["signature"]
    return doc


def quorum_plus_bad_entry() -> dict[str, object]:
    """Two valid signatures (a quorum) plus a third, tampered one: every entry must verify."""
    doc = token(keys=(A1, A2, A3))
    doc["signatures"][2]["signature"] = flip_bit(doc["signatures"][2]["signature"])
    return doc


def hs256_confusion() -> dict[str, object]:
    """alg HS256 with the Ed25519 public key as the HMAC secret (classic key confusion)."""
    import hashlib
    import hmac

    payload = payload_of(claims())
    protected = b64url_encode(json.dumps(header(A1, alg="HS256")).encode())
    mac = hmac.new(signing.raw_public_key(A1), f"{protected}.{payload}".encode(), hashlib.sha256)
    return {
        "payload": payload,
        "signatures": [
            {"protected": protected, "signature": b64url_encode(mac.digest())},
            entry(A2, payload),
        ],
    }


HEADER = b64url_encode(json.dumps(header(A1)).encode())

CASES = [
    # --- step 1: size (413)
    Case("oversize-b64-string", lambda: "eyJ" + "A" * 17_000, 413, "token_too_large"),
    Case(
        "oversize-json-text", lambda: '{"payload":"' + "A" * 17_000 + '"}', 413, "token_too_large"
    ),
    Case(
        "oversize-object",
        lambda: {"payload": "A" * 17_000, "signatures": []},
        413,
        "token_too_large",
    ),
    # --- step 1: envelope (400)
    Case("not-object-or-string", lambda: 12345, 400, "malformed_token"),
    Case("json-list", lambda: [token()], 400, "malformed_token"),
    Case("plain-text", lambda: "hello", 400, "malformed_token"),
    Case("bad-outer-base64", lambda: "eyJ!!!", 400, "malformed_token"),
    Case("outer-b64-padded", lambda: signing.to_b64(token()) + "=", 400, "malformed_token"),
    Case("empty-object", lambda: {}, 400, "malformed_token"),
    Case(
        "outer-duplicate-key",
        lambda: '{"payload":"x","payload":"y","signatures":[]}',
        400,
        "malformed_token",
    ),
    Case("unknown-top-field", lambda: with_field(token(), header={}), 400, "malformed_token"),
    Case("missing-signatures", lambda: {"payload": payload_of(claims())}, 400, "malformed_token"),
    Case("empty-signatures", lambda: token(keys=()), 400, "malformed_token"),
    Case(
        "seventeen-signatures",
        lambda: with_field(token(), signatures=[token()["signatures"][0]] * 17),
        400,
        "malformed_token",
    ),
    Case("signatures-not-list", lambda: with_field(token(), signatures={}), 400, "malformed_token"),
    Case(
        "unprotected-header-member",
        lambda: with_field(
            token(), signatures=[{**token()["signatures"][0], "header": {"kid": "x"}}]
        ),
        400,
        "malformed_token",
    ),
    Case(
        "protected-not-string",
        lambda: with_field(token(), signatures=[{"protected": 5, "signature": "AA"}]),
        400,
        "malformed_token",
    ),
    # --- step 1: payload and claims (400)
    Case("payload-not-base64", lambda: with_field(token(), payload="***"), 400, "malformed_token"),
    Case(
        "payload-padded",
        lambda: with_field(token(), payload=payload_of(claims()) + "="),
        400,
        "malformed_token",
    ),
    Case("payload-not-json", lambda: with_payload(b"not json"), 400, "malformed_token"),
    Case(
        "payload-invalid-utf8",
        lambda: with_payload(b'{"operation":"\xff"}'),
        400,
        "malformed_token",
    ),
    Case(
        "payload-bom",
        lambda: with_payload(b"\xef\xbb\xbf" + claims_bytes()),
        400,
        "malformed_token",
    ),
    Case("claims-array", lambda: with_payload(b"[]"), 400, "malformed_token"),
    Case(
        "duplicate-claim",
        lambda: replace_in_claims(
            b'"operation":"model-load"', b'"operation":"model-load","operation":"model-load"'
        ),
        400,
        "malformed_token",
    ),
    Case(
        "nan",
        lambda: replace_in_claims(b'"policyEpoch":3', b'"policyEpoch":NaN'),
        400,
        "malformed_token",
    ),
    Case(
        "infinity",
        lambda: replace_in_claims(b'"policyEpoch":3', b'"policyEpoch":Infinity'),
        400,
        "malformed_token",
    ),
    Case(
        "float-issued-at",
        lambda: replace_in_claims(f'"issuedAt":{NOW}'.encode(), f'"issuedAt":{NOW}.0'.encode()),
        400,
        "malformed_token",
    ),
    Case(
        "exponent-integer",
        lambda: replace_in_claims(b'"policyEpoch":3', b'"policyEpoch":3e0'),
        400,
        "malformed_token",
    ),
    Case(
        "float-in-params",
        lambda: token(claims(params={"temperature": 0.5})),
        400,
        "malformed_token",
    ),
    Case("bool-as-int", lambda: token(claims(policyEpoch=True)), 400, "malformed_token"),
    Case("string-as-int", lambda: token(claims(issuedAt=str(NOW))), 400, "malformed_token"),
    Case("negative-epoch", lambda: token(claims(policyEpoch=-1)), 400, "malformed_token"),
    Case("huge-int", lambda: token(claims(expiresAt=2**64)), 400, "malformed_token"),
    Case("huge-int-in-params", lambda: token(claims(params={"n": 2**60})), 400, "malformed_token"),
    Case("unknown-claim", lambda: token(claims(admin=True)), 400, "malformed_token"),
    Case("missing-nonce", lambda: token(claims(nonce=DROP)), 400, "malformed_token"),
    Case("missing-aud", lambda: token(claims(aud=DROP)), 400, "malformed_token"),
    Case("missing-model-id", lambda: token(claims(modelId=DROP)), 400, "malformed_token"),
    Case("empty-model-id", lambda: token(claims(modelId="")), 400, "malformed_token"),
    Case("short-nonce", lambda: token(claims(nonce="abc123")), 400, "malformed_token"),
    Case("nonce-bad-alphabet", lambda: token(claims(nonce="a+b/c=" * 5)), 400, "malformed_token"),
    Case(
        "unknown-operation", lambda: token(claims(operation="model-delete")), 400, "malformed_token"
    ),
    Case("params-not-object", lambda: token(claims(params=["x"])), 400, "malformed_token"),
    Case(
        "params-reserved-key",
        lambda: token(claims(params={"verifiedOpToken": "x"})),
        400,
        "malformed_token",
    ),
    Case("signers-not-list", lambda: token(claims(signers="admin1")), 400, "malformed_token"),
    Case(
        "params-too-deep",
        lambda: token(claims(params={"a": [[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]})),
        400,
        "malformed_token",
    ),
    Case(
        "lone-surrogate",
        lambda: replace_in_claims(b'"awq-4bit"', b'"\\ud800"'),
        400,
        "malformed_token",
    ),
    Case(
        "legacy-mac-not-hex",
        lambda: {"opToken": claims(), "signature": "zz"},
        400,
        "malformed_token",
        legacy_key=LEGACY_KEY,
    ),
    Case(
        "legacy-unknown-field",
        lambda: with_field(legacy(claims()), signers=["admin1"]),
        400,
        "malformed_token",
        legacy_key=LEGACY_KEY,
    ),
    # --- step 2: signature entries (401)
    Case("alg-none", lambda: forged_header(alg="none"), 401, "bad_signature"),
    Case("alg-hs256-key-confusion", hs256_confusion, 401, "bad_signature"),
    Case("alg-lowercase", lambda: forged_header(alg="eddsa"), 401, "bad_signature"),
    Case("alg-ed25519", lambda: forged_header(alg="Ed25519"), 401, "bad_signature"),
    Case("typ-jwt", lambda: forged_header(typ="JWT"), 401, "bad_signature"),
    Case("typ-missing", lambda: forged_header(typ=DROP), 401, "bad_signature"),
    Case("crit-present", lambda: forged_header(crit=["exp"]), 401, "bad_signature"),
    Case(
        "extra-header-jku",
        lambda: forged_header(jku="https://evil.example/keys"),
        401,
        "bad_signature",
    ),
    Case(
        "kid-uppercase", lambda: forged_header(kid=signing.kid_of(A1).upper()), 401, "bad_signature"
    ),
    Case("kid-short", lambda: forged_header(kid=signing.kid_of(A1)[:63]), 401, "bad_signature"),
    Case("kid-not-string", lambda: forged_header(kid=1), 401, "bad_signature"),
    Case(
        "header-duplicate-key",
        lambda: with_protected(
            b64url_encode(
                b'{"alg":"none","alg":"EdDSA","kid":"'
                + signing.kid_of(A1).encode()
                + b'","typ":"quorum-optoken+json"}'
            )
        ),
        401,
        "bad_signature",
    ),
    Case("header-not-base64", lambda: with_protected("e30*"), 401, "bad_signature"),
    Case(
        "header-padded-base64",
        lambda: with_protected(HEADER + "=" * (-len(HEADER) % 4 or 4)),
        401,
        "bad_signature",
    ),
    Case(
        "signature-not-base64",
        lambda: tamper_signature(lambda s: s[:-2] + "!!"),
        401,
        "bad_signature",
    ),
    Case("signature-truncated", lambda: tamper_signature(lambda s: s[:-4]), 401, "bad_signature"),
    Case("signature-bit-flipped", lambda: tamper_signature(flip_bit), 401, "bad_signature"),
    Case("signature-from-other-token", stolen_signature, 401, "bad_signature"),
    Case("unknown-key", lambda: token(keys=(A1, OUTSIDER)), 401, "unknown_key"),
    Case("unknown-key-beside-quorum", lambda: token(keys=(A1, A2, OUTSIDER)), 401, "unknown_key"),
    Case("same-kid-twice", lambda: token(keys=(A1, A1)), 401, "duplicate_signer"),
    Case("same-principal-two-keys", lambda: token(keys=(A1, A1_NEW)), 401, "duplicate_signer"),
    Case("one-bad-entry-beside-quorum", quorum_plus_bad_entry, 401, "bad_signature"),
    Case(
        "legacy-disabled",
        lambda: legacy(claims(operation="cache-flush", modelId=None, params={})),
        401,
        "legacy_disabled",
        operation="cache-flush",
        model=None,
        params={},
    ),
    Case(
        "legacy-wrong-key",
        lambda: legacy(claims(operation="cache-flush", modelId=None, params={}), key=b"x" * 32),
        401,
        "bad_signature",
        operation="cache-flush",
        model=None,
        params={},
        legacy_key=LEGACY_KEY,
    ),
    # --- step 3: threshold (403)
    Case("one-of-two", lambda: token(keys=(A1,)), 403, "threshold_not_met"),
    Case(
        "signers-claim-lies",
        lambda: token(claims(signers=["admin1", "admin2", "admin3"]), keys=(A3,)),
        403,
        "threshold_not_met",
    ),
    Case(
        "principal-not-allowed-for-operation",
        lambda: token(
            claims(operation="task-cancel", modelId=None, params={"taskId": "t1"}), keys=(A2, A3)
        ),
        403,
        "threshold_not_met",
        operation="task-cancel",
        model=None,
        params={"taskId": "t1"},
    ),
    Case(
        "legacy-not-allowed-for-load",
        lambda: legacy(claims()),
        403,
        "legacy_not_allowed",
        legacy_key=LEGACY_KEY,
    ),
    # --- step 4: binding (403; stale epoch 401)
    Case(
        "other-operation", lambda: token(claims(operation="model-unload")), 403, "binding_mismatch"
    ),
    Case("other-model", lambda: token(claims(modelId="evil/model")), 403, "binding_mismatch"),
    Case(
        "null-model-for-named-request", lambda: token(claims(modelId=None)), 403, "binding_mismatch"
    ),
    Case(
        "extra-param",
        lambda: token(claims(params={**PARAMS, "evictModel": "x"})),
        403,
        "binding_mismatch",
    ),
    Case("missing-param", lambda: token(claims(params={})), 403, "binding_mismatch"),
    Case(
        "param-int-vs-bool",
        lambda: token(claims(params={"n": 1})),
        403,
        "binding_mismatch",
        params={"n": True},
    ),
    Case(
        "param-int-vs-string",
        lambda: token(claims(params={"n": 1})),
        403,
        "binding_mismatch",
        params={"n": "1"},
    ),
    Case("other-runner", lambda: token(claims(aud="runner-b")), 403, "binding_mismatch"),
    Case("other-issuer", lambda: token(claims(iss="gov-evil")), 403, "binding_mismatch"),
    Case("stale-policy-epoch", lambda: token(claims(policyEpoch=2)), 401, "stale_policy_epoch"),
    # --- step 5: time (401)
    Case(
        "issued-in-future",
        lambda: token(claims(issuedAt=NOW + 31, expiresAt=NOW + 100)),
        401,
        "token_time_invalid",
    ),
    Case(
        "too-old",
        lambda: token(claims(issuedAt=NOW - 331, expiresAt=NOW - 100)),
        401,
        "token_time_invalid",
    ),
    Case(
        "expired",
        lambda: token(claims(issuedAt=NOW - 100, expiresAt=NOW - 30)),
        401,
        "token_time_invalid",
    ),
    Case("zero-lifetime", lambda: token(claims(expiresAt=NOW)), 401, "token_time_invalid"),
    Case("negative-lifetime", lambda: token(claims(expiresAt=NOW - 1)), 401, "token_time_invalid"),
    Case(
        "lifetime-over-300", lambda: token(claims(expiresAt=NOW + 301)), 401, "token_time_invalid"
    ),
]


def test_rejections_table_is_large_and_unique() -> None:
    """The table holds at least 40 distinct cases with unique ids."""
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids)) >= 40


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
async def test_verifier_rejects_token(case: Case) -> None:
    """Each bad token gets its exact status and code, is audited, and burns no nonce."""
    verifier, nonces, audit = make_verifier(legacy_key=case.legacy_key)
    with pytest.raises(GovernanceError) as info:
        await verifier.authorize(case.build(), case.operation, case.model, case.params)
    assert (info.value.status, info.value.code) == (case.status, case.code), str(info.value)
    assert len(nonces) == 0
    [record] = audit.records
    assert (record.outcome, record.reason, record.status) == ("rejected", case.code, case.status)

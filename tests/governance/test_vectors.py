"""The test vectors in docs/governance.md are exactly what the code produces and accepts."""

from __future__ import annotations

import json
from pathlib import Path

from governance import signing
from governance.audit import MemoryAuditSink
from governance.encoding import b64url_decode
from governance.nonces import MemoryNonceStore
from governance.registry import parse_registry
from governance.verifier import Verifier

DOC = Path(__file__).resolve().parents[2] / "docs" / "governance.md"
ISSUED_AT = 1_767_225_600
SEEDS = {"admin1": bytes([1]) * 32, "admin2": bytes([2]) * 32, "admin3": bytes([3]) * 32}
KEYS = {name: signing.generate_key(seed) for name, seed in SEEDS.items()}
PUBLIC = {
    "admin1": "iojj3XQJ8ZX9UtstPLpdcspnCb8dlBIb83SIAbQPb1w",
    "admin2": "gTl3Dqh9F19Wo1Rmw0x-zMuNipG07jeiXfYPW4_Js5Q",
    "admin3": "7UkoxijRwsbq6QM4kFmVYSlZJzpcY_k2NsFGFKyHN9E",
}
CLAIMS_JSON = (
    '{"aud":"runner-gpu-0","expiresAt":1767225900,"iss":"gov-dev","issuedAt":1767225600,'
    '"modelId":"meta-llama/Llama-3.1-8B-Instruct","nonce":"qZ3x8lH2YwZk1m0TnVQp4w",'
    '"operation":"model-load","params":{"maxContextLength":32768,"quantization":"awq-4bit"},'
    '"policyEpoch":1,"signers":["admin1","admin3"]}'
)
SIGNATURES = {
    "admin1": "E90QTbb5zADOhg-e94F4RAZug7-VT3-WSxHB5G79Qygf90YR4QJKbl"
    "JuN86BkTJ0qIdXdhHKpbBznIDt0wxUDA",
    "admin3": "7TgvHEQCizr40Lepxme7LtT8hGN5MNklyDuJM8yhh99GfAH3ERUXkD"
    "1vGDfGLFk9hkFuz8usygKMEzT0GS4oAQ",
}
LEGACY_KEY = b"0" * 64
LEGACY_MAC = "7086fb0677345388958ce99ddb360577d7f7cf7a8e86df22f07ffad439fb608e"


def vector_token() -> dict[str, object]:
    proposal = signing.propose(
        operation="model-load",
        model_id="meta-llama/Llama-3.1-8B-Instruct",
        params={"quantization": "awq-4bit", "maxContextLength": 32768},
        aud="runner-gpu-0",
        iss="gov-dev",
        issued_at=ISSUED_AT,
        ttl_s=300,
        policy_epoch=1,
        nonce="qZ3x8lH2YwZk1m0TnVQp4w",
        signers=["admin1", "admin3"],
    )
    return signing.combine(
        [signing.sign(proposal, KEYS["admin1"]), signing.sign(proposal, KEYS["admin3"])]
    )


def test_vectors_keys_payload_and_signatures_are_stable() -> None:
    """Fixed seeds give the published keys; the payload and signatures match byte for byte."""
    assert {n: signing.public_key_b64(k) for n, k in KEYS.items()} == PUBLIC
    token = vector_token()
    assert b64url_decode(token["payload"]).decode() == CLAIMS_JSON  # type: ignore[arg-type]
    assert [e["signature"] for e in token["signatures"]] == list(SIGNATURES.values())  # type: ignore[attr-defined]


def test_vectors_appear_verbatim_in_the_docs() -> None:
    """docs/governance.md shows the same keys, claims, signatures and base64url token."""
    text = DOC.read_text()
    for fragment in [
        *PUBLIC.values(),
        CLAIMS_JSON,
        *SIGNATURES.values(),
        LEGACY_MAC,
        signing.to_b64(vector_token()),
    ]:
        assert fragment in text, fragment[:40]


async def test_vectors_token_verifies_at_its_time() -> None:
    """The vector token is approved 2-of-3 for runner-gpu-0 at issuedAt."""
    registry = parse_registry(
        json.dumps(
            {
                "issuer": "gov-dev",
                "policyEpoch": 1,
                "expires": "2027-12-31T00:00:00Z",
                "principals": {n: [p] for n, p in PUBLIC.items()},
                "operations": {"model-load": {"threshold": 2, "principals": sorted(PUBLIC)}},
            }
        )
    )
    clock = lambda: float(ISSUED_AT)  # noqa: E731
    verifier = Verifier(registry, MemoryNonceStore(clock), MemoryAuditSink(), "runner-gpu-0", clock)
    approval = await verifier.authorize(
        signing.to_b64(vector_token()),
        "model-load",
        "meta-llama/Llama-3.1-8B-Instruct",
        {"maxContextLength": 32768, "quantization": "awq-4bit"},
    )
    assert approval.principals == ("admin1", "admin3")


def test_vectors_legacy_mac() -> None:
    """The legacy HMAC vector: HMAC-SHA256 over sorted, space-free UTF-8 JSON of the claims."""
    claims = {
        "operation": "cache-flush",
        "modelId": None,
        "params": {"scope": "all"},
        "issuedAt": ISSUED_AT,
        "signers": ["admin1"],
        "nonce": "qZ3x8lH2YwZk1m0TnVQp4w",
    }
    assert signing.sign_legacy(claims, LEGACY_KEY)["signature"] == LEGACY_MAC

"""PyJWT's EdDSA JWS decode accepts and rejects exactly the signature entries our verifier does."""

from __future__ import annotations

import asyncio
from typing import Any

import jwt
import pytest
from jwt.api_jws import PyJWS

from governance.errors import GovernanceError
from tests.governance.support import (
    A1,
    A2,
    MODEL,
    OPERATION,
    PARAMS,
    claims,
    flip_bit,
    make_verifier,
    token,
)

JWS = PyJWS(algorithms=["EdDSA"])


def cases() -> dict[str, dict[str, Any]]:
    good = token()
    bad = token()
    bad["signatures"][0]["signature"] = flip_bit(bad["signatures"][0]["signature"])
    swapped = token()
    other = token(claims())
    swapped["signatures"][0]["signature"] = other["signatures"][0]["signature"]
    return {"valid": good, "bit-flipped": bad, "signature-from-other-payload": swapped}


def pyjwt_accepts(doc: dict[str, Any]) -> bool:
    keys = {0: A1.public_key(), 1: A2.public_key()}
    try:
        for index, entry in enumerate(doc["signatures"]):
            compact = f"{entry['protected']}.{doc['payload']}.{entry['signature']}"
            JWS.decode(compact, key=keys[index], algorithms=["EdDSA"])
    except jwt.exceptions.PyJWTError:
        return False
    return True


def ours_accepts(doc: dict[str, Any]) -> bool:
    verifier, _, _ = make_verifier()
    try:
        asyncio.run(verifier.authorize(doc, OPERATION, MODEL, dict(PARAMS)))
    except GovernanceError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(cases()))
def test_pyjwt_agreement(name: str) -> None:
    """For valid and tampered entries, PyJWT and the verifier reach the same verdict."""
    doc = cases()[name]
    assert pyjwt_accepts(doc) == ours_accepts(doc) == (name == "valid")

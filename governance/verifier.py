"""The verifier: turns a raw op token plus the request it came with into an Approval, or an error.

`Verifier.authorize` is the only entry point the runner calls. It never runs the operation;
an Approval means "every check passed, the nonce is spent and the audit record is written".

Signatures are checked with `cryptography`'s Ed25519 directly over the compact-JWS signing
input `protected.payload`: that is exactly what PyJWT's `jwt.api_jws.decode(...,
algorithms=["EdDSA"])` computes, minus its per-character base64 scan that doubled the cost
(bench/governance). Our strict header parsing already enforces more than PyJWT does, and
tests/governance/test_pyjwt_agreement.py pins that PyJWT accepts and rejects the same
entries as this verifier.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature

from governance.audit import AuditRecord, AuditSink
from governance.encoding import canonical
from governance.errors import (
    AuditUnavailable,
    BadSignature,
    BindingMismatch,
    DuplicateSigner,
    GovernanceError,
    GovernanceUnavailable,
    LegacyDisabled,
    LegacyNotAllowed,
    NonceReplayed,
    RegistryExpired,
    StalePolicyEpoch,
    ThresholdNotMet,
    TokenTimeInvalid,
    UnknownKey,
)
from governance.nonces import NonceStore
from governance.registry import LEGACY_PRINCIPAL, Registry
from governance.token import Claims, JwsToken, LegacyToken, parse_token, read_protected_header

SKEW_S = 30
MAX_AGE_S = 300
MAX_LIFETIME_S = 300


@dataclass(frozen=True)
class Approval:
    """What was approved, by whom; the runner executes exactly this."""

    operation: str
    model_id: str | None
    params: Mapping[str, object]
    principals: tuple[str, ...]
    key_ids: tuple[str, ...]
    nonce_sha256: str
    issued_at: int
    expires_at: int
    legacy: bool


@dataclass
class _Trail:
    """What is known so far about a call, for its audit record."""

    principals: tuple[str, ...] = ()
    key_ids: tuple[str, ...] = ()
    nonce_sha256: str | None = None


class Verifier:
    def __init__(
        self,
        registry: Registry,
        nonces: NonceStore,
        audit: AuditSink,
        runner_id: str,
        clock: Callable[[], float],
        legacy_key: bytes | None = None,
    ) -> None:
        if legacy_key is not None and len(legacy_key) < 32:
            raise ValueError("the legacy HMAC key must be at least 32 bytes")
        self.registry = registry
        self.runner_id = runner_id
        self._nonces = nonces
        self._audit = audit
        self._clock = clock
        self._legacy_key = legacy_key

    @property
    def nonce_store(self) -> NonceStore:
        return self._nonces

    @property
    def audit_sink(self) -> AuditSink:
        return self._audit

    async def authorize(
        self, raw_token: object, operation: str, model_id: str | None, params: Mapping[str, object]
    ) -> Approval:
        """Decide whether `raw_token` approves `operation` on `model_id` with `params`.

        0. The registry has not expired (else 503, on every call).
        1. Size <= 16 KiB (413); strict parsing of envelope and claims (400).
        2. Every signature entry: strict header (alg EdDSA, typ, 64-hex kid, no crit),
           known kid, no kid or principal twice, signature verifies (401). Legacy HMAC form:
           only with a configured key, MAC must match (401).
        3. Distinct principals allowed for `operation` reach its threshold; the legacy form
           counts as one principal and only where the registry allows it (403).
        4. Bind operation, modelId, params, aud (= runner id), iss (= registry issuer) (403);
           policyEpoch >= the registry's (401).
        5. Time: issuedAt <= now + 30 s, issuedAt >= now - 330 s, 0 < lifetime <= 300 s,
           now < expiresAt + 30 s (401).
        6. Only now consume the nonce, atomically, until the token can no longer be valid:
           seen -> 409; store unreachable -> 503.
        7. Append the audit record before returning the Approval (unwritable -> 503).
        Every rejection is audited with its reason; no token or key material is logged.
        """
        now = self._clock()
        trail = _Trail()
        try:
            approval = await self._decide(raw_token, operation, model_id, params, now, trail)
        except GovernanceError as exc:
            await self._record(now, operation, model_id, params, trail, exc)
            raise
        await self._record(now, operation, model_id, params, trail, None)  # step 7
        return approval

    async def _decide(
        self,
        raw_token: object,
        operation: str,
        model_id: str | None,
        params: Mapping[str, object],
        now: float,
        trail: _Trail,
    ) -> Approval:
        # 0. Registry expiry.
        if self.registry.expired(now):
            raise RegistryExpired(
                "the signer registry has expired; renew it to run lifecycle calls"
            )
        # 1. Size and strict parsing.
        token = parse_token(raw_token)
        claims = token.claims
        trail.nonce_sha256 = hashlib.sha256(claims.nonce.encode("ascii")).hexdigest()
        # 2. Signatures.
        if isinstance(token, LegacyToken):
            self._check_legacy_mac(token)
            principals: tuple[str, ...] = (LEGACY_PRINCIPAL,)
            key_ids: tuple[str, ...] = ()
        else:
            principals, key_ids = self._check_signatures(token)
        trail.principals, trail.key_ids = principals, key_ids
        # 3. Threshold over distinct allowed principals.
        self._check_threshold(operation, principals, legacy=isinstance(token, LegacyToken))
        # 4. Binding.
        self._check_binding(claims, operation, model_id, params)
        # 5. Time window.
        check_time(claims, now)
        # 6. Nonce, only after everything else passed.
        ttl_s = max(1, math.ceil(claims.expires_at + SKEW_S - now))
        if not await self._nonces.consume(claims.nonce, ttl_s):
            raise NonceReplayed("this token's nonce was already used")
        return Approval(
            operation=operation,
            model_id=model_id,
            params=dict(params),
            principals=tuple(sorted(principals)),
            key_ids=key_ids,
            nonce_sha256=trail.nonce_sha256,
            issued_at=claims.issued_at,
            expires_at=claims.expires_at,
            legacy=isinstance(token, LegacyToken),
        )

    def _check_legacy_mac(self, token: LegacyToken) -> None:
        if self._legacy_key is None:
            raise LegacyDisabled("legacy HMAC tokens are not enabled on this runner")
        expected = hmac.new(self._legacy_key, token.signed_bytes, hashlib.sha256).digest()
        if not hmac.compare_digest(expected, token.mac):
            raise BadSignature("legacy HMAC does not match")

    def _check_signatures(self, token: JwsToken) -> tuple[tuple[str, ...], tuple[str, ...]]:
        principals: list[str] = []
        key_ids: list[str] = []
        for index, entry in enumerate(token.signatures):
            kid, signature = read_protected_header(entry)
            signer = self.registry.keys.get(kid)
            if signer is None:
                raise UnknownKey(f"signature {index}: key {kid} is not in the registry")
            if kid in key_ids:
                raise DuplicateSigner(f"signature {index}: key {kid} signs twice")
            if signer.principal in principals:
                raise DuplicateSigner(
                    f"signature {index}: principal {signer.principal} signs twice"
                )
            try:
                signer.public_key.verify(signature, token.signing_input(entry))
            except InvalidSignature as exc:
                raise BadSignature(f"signature {index} (key {kid}) does not verify") from exc
            principals.append(signer.principal)
            key_ids.append(kid)
        return tuple(principals), tuple(key_ids)

    def _check_threshold(self, operation: str, principals: tuple[str, ...], legacy: bool) -> None:
        policy = self.registry.operations.get(operation)
        if policy is None:
            raise ThresholdNotMet(f"the registry lets nobody approve {operation}")
        if legacy and not policy.legacy:
            raise LegacyNotAllowed(f"legacy HMAC tokens are not accepted for {operation}")
        allowed = {p for p in principals if legacy or p in policy.principals}
        if len(allowed) < policy.threshold:
            raise ThresholdNotMet(
                f"{operation} needs {policy.threshold} distinct allowed principals, "
                f"got {len(allowed)}"
            )

    def _check_binding(
        self, claims: Claims, operation: str, model_id: str | None, params: Mapping[str, object]
    ) -> None:
        if claims.operation != operation:
            raise BindingMismatch(f"token approves {claims.operation}, not {operation}")
        if claims.model_id != model_id:
            raise BindingMismatch("token approves a different modelId")
        try:
            same_params = canonical(claims.params) == canonical(params)
        except (TypeError, ValueError):
            same_params = False
        if not same_params:
            raise BindingMismatch("token approves different parameters than the request holds")
        if claims.aud is not None and claims.aud != self.runner_id:
            raise BindingMismatch("token is addressed to another runner")
        if claims.iss is not None and claims.iss != self.registry.issuer:
            raise BindingMismatch("token was issued by another issuer")
        if claims.policy_epoch is not None and claims.policy_epoch < self.registry.policy_epoch:
            raise StalePolicyEpoch(
                f"token policyEpoch {claims.policy_epoch} < registry {self.registry.policy_epoch}"
            )

    async def _record(
        self,
        now: float,
        operation: str,
        model_id: str | None,
        params: Mapping[str, object],
        trail: _Trail,
        error: GovernanceError | None,
    ) -> None:
        if error is not None:  # what an unauthenticated caller wrote is kept short
            params = capped_params(params)
            model_id = (
                model_id
                if model_id is None or len(model_id) <= DETAIL_MAX
                else (model_id[:DETAIL_MAX] + "...")
            )
        record = AuditRecord(
            time=now,
            runner_id=self.runner_id,
            operation=operation,
            model_id=model_id,
            params=params,
            outcome="approved" if error is None else "rejected",
            reason="ok" if error is None else error.code,
            status=200 if error is None else error.status,
            principals=trail.principals,
            key_ids=trail.key_ids,
            nonce_sha256=trail.nonce_sha256,
            detail="" if error is None else capped(str(error)),
        )
        try:
            await self._audit.append(record)
        except AuditUnavailable as exc:
            if error is None:
                raise
            if isinstance(error, GovernanceUnavailable):  # a 503 already: name the first cause
                raise error from exc
            raise exc from error

    async def aclose(self) -> None:
        await self._nonces.aclose()
        await self._audit.aclose()


DETAIL_MAX = 256
"""Characters of a rejection's `detail` (and of a rejected call's modelId) kept in the audit
log: a refusal quotes what the caller sent, and a caller without a token must not be able
to write big fsync'd records."""
PARAMS_MAX = 1024
"""Bytes of a rejected call's params kept as they are; larger ones become their digest."""


def capped(text: str, limit: int = DETAIL_MAX) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def capped_params(params: Mapping[str, object]) -> Mapping[str, object]:
    """A rejected call's params as audited: as sent when small, else their SHA-256 and size."""
    text = json.dumps(params, sort_keys=True, default=str)
    if len(text) <= PARAMS_MAX:
        return params
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return {"_omitted": {"sha256": digest, "bytes": len(text)}}


def check_time(claims: Claims, now: float) -> None:
    """Step 5 as a pure function of the claims and the time (TokenTimeInvalid, 401)."""
    if claims.issued_at > now + SKEW_S:
        raise TokenTimeInvalid("issuedAt is in the future")
    if claims.issued_at < now - MAX_AGE_S - SKEW_S:
        raise TokenTimeInvalid("token is too old")
    if not 0 < claims.expires_at - claims.issued_at <= MAX_LIFETIME_S:
        raise TokenTimeInvalid(f"expiresAt - issuedAt must be in 1..{MAX_LIFETIME_S} seconds")
    if now >= claims.expires_at + SKEW_S:
        raise TokenTimeInvalid("token has expired")

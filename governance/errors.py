"""Every error the governance package raises, and the HTTP status each one maps to.

One row per error (`faults.QuorumError.row`); the runner's one error map reads
`status`, `code`, `type`, `extra` and `headers` from them.

    GovernanceError (faults.QuorumError) (base; never raised directly)
    ├── TokenTooLarge                    413 token_too_large        step 1
    ├── MalformedToken                   400 malformed_token        step 1
    ├── TokenRejected                    401 (authentication_error)
    │   ├── BadSignature                 401 bad_signature          step 2
    │   ├── UnknownKey                   401 unknown_key            step 2
    │   ├── DuplicateSigner              401 duplicate_signer       step 2 (kid/principal twice)
    │   ├── LegacyDisabled               401 legacy_disabled        step 2 (HMAC form, no key)
    │   ├── StalePolicyEpoch             401 stale_policy_epoch     step 4
    │   └── TokenTimeInvalid             401 token_time_invalid     step 5
    ├── TokenForbidden                   403 (permission_error)
    │   ├── ThresholdNotMet              403 threshold_not_met      step 3
    │   ├── LegacyNotAllowed             403 legacy_not_allowed     step 3
    │   └── BindingMismatch              403 binding_mismatch       step 4
    ├── NonceReplayed                    409 nonce_replayed         step 6
    ├── GovernanceUnavailable            503 (server_error, Retry-After)
    │   ├── NonceStoreUnavailable        503 nonce_store_unavailable  step 6
    │   │   └── NonceNotReplicated       503 nonce_store_unavailable  step 6 (WAIT short)
    │   ├── AuditUnavailable             503 audit_unavailable        step 7
    │   └── RegistryExpired              503 registry_expired         before step 1
    ConfigError (faults.QuorumError)
    └── ConfigInvalid                    500 config_invalid   (start-up only: refuse to run)
        └── RegistryInvalid              500 registry_invalid
"""

from __future__ import annotations

from faults import ConfigError, QuorumError


class GovernanceError(QuorumError):
    """Root of governance's refusals (never raised itself)."""

    code = "governance_error"


TokenTooLarge = GovernanceError.row("TokenTooLarge", "token_too_large", 413)
MalformedToken = GovernanceError.row("MalformedToken", "malformed_token", 400)
TokenRejected = GovernanceError.row("TokenRejected", "token_rejected", 401)
BadSignature = TokenRejected.row("BadSignature", "bad_signature")
UnknownKey = TokenRejected.row("UnknownKey", "unknown_key")
DuplicateSigner = TokenRejected.row("DuplicateSigner", "duplicate_signer")
LegacyDisabled = TokenRejected.row("LegacyDisabled", "legacy_disabled")
StalePolicyEpoch = TokenRejected.row("StalePolicyEpoch", "stale_policy_epoch")
TokenTimeInvalid = TokenRejected.row("TokenTimeInvalid", "token_time_invalid")
TokenForbidden = GovernanceError.row("TokenForbidden", "token_forbidden", 403)
ThresholdNotMet = TokenForbidden.row("ThresholdNotMet", "threshold_not_met")
LegacyNotAllowed = TokenForbidden.row("LegacyNotAllowed", "legacy_not_allowed")
BindingMismatch = TokenForbidden.row("BindingMismatch", "binding_mismatch")
NonceReplayed = GovernanceError.row("NonceReplayed", "nonce_replayed", 409)
GovernanceUnavailable = GovernanceError.row(
    "GovernanceUnavailable", "governance_unavailable", 503, headers={"Retry-After": "5"}
)
NonceStoreUnavailable = GovernanceUnavailable.row(
    "NonceStoreUnavailable", "nonce_store_unavailable"
)
NonceNotReplicated = NonceStoreUnavailable.row(
    "NonceNotReplicated",
    "nonce_store_unavailable",
    template="the spend reached {replicasAcked} of the {replicasAsked} Redis replicas asked "
    "for (NONCE_REPLICAS) within {timeoutMs} ms, so a failover could forget it: not "
    "trusted, the operation was not run; the nonce was {released}",
    extra=("replicasAcked", "replicasAsked"),
)
AuditUnavailable = GovernanceUnavailable.row("AuditUnavailable", "audit_unavailable")
RegistryExpired = GovernanceUnavailable.row(
    "RegistryExpired", "registry_expired", headers={"Retry-After": "60"}
)
ConfigInvalid = ConfigError.row("ConfigInvalid", "config_invalid")
"""Governance configuration is unusable; the runner must refuse to start."""
RegistryInvalid = ConfigInvalid.row("RegistryInvalid", "registry_invalid")
"""The signer registry is unsafe or unreadable."""

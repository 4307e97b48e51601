"""Every error the governance package raises, and the HTTP status each one maps to.

The runner's one error map reads `status`, `code`, `type`, `extra` and `headers`
from these classes; nothing here knows about HTTP itself.

    GovernanceError                      (base; never raised directly)
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
    │   ├── AuditUnavailable             503 audit_unavailable        step 7
    │   └── RegistryExpired              503 registry_expired         before step 1
    └── ConfigInvalid                    500 config_invalid   (start-up only: refuse to run)
        └── RegistryInvalid              500 registry_invalid
"""

from __future__ import annotations


class GovernanceError(Exception):
    """Base of every governance error; carries its HTTP mapping as class attributes."""

    status: int = 500
    code: str = "governance_error"
    type: str = "server_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.extra: dict[str, object] = {}
        self.headers: dict[str, str] = {}


class TokenTooLarge(GovernanceError):
    status = 413
    code = "token_too_large"
    type = "invalid_request_error"


class MalformedToken(GovernanceError):
    status = 400
    code = "malformed_token"
    type = "invalid_request_error"


class TokenRejected(GovernanceError):
    status = 401
    code = "token_rejected"
    type = "authentication_error"


class BadSignature(TokenRejected):
    code = "bad_signature"


class UnknownKey(TokenRejected):
    code = "unknown_key"


class DuplicateSigner(TokenRejected):
    code = "duplicate_signer"


class LegacyDisabled(TokenRejected):
    code = "legacy_disabled"


class StalePolicyEpoch(TokenRejected):
    code = "stale_policy_epoch"


class TokenTimeInvalid(TokenRejected):
    code = "token_time_invalid"


class TokenForbidden(GovernanceError):
    status = 403
    code = "token_forbidden"
    type = "permission_error"


class ThresholdNotMet(TokenForbidden):
    code = "threshold_not_met"


class LegacyNotAllowed(TokenForbidden):
    code = "legacy_not_allowed"


class BindingMismatch(TokenForbidden):
    code = "binding_mismatch"


class NonceReplayed(GovernanceError):
    status = 409
    code = "nonce_replayed"
    type = "invalid_request_error"


class GovernanceUnavailable(GovernanceError):
    status = 503
    code = "governance_unavailable"
    type = "server_error"
    retry_after_s: int = 5

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": str(self.retry_after_s)}


class NonceStoreUnavailable(GovernanceUnavailable):
    code = "nonce_store_unavailable"


class AuditUnavailable(GovernanceUnavailable):
    code = "audit_unavailable"


class RegistryExpired(GovernanceUnavailable):
    code = "registry_expired"
    retry_after_s = 60


class ConfigInvalid(GovernanceError):
    """Governance configuration is unusable; the runner must refuse to start."""

    status = 500
    code = "config_invalid"
    type = "server_error"


class RegistryInvalid(ConfigInvalid):
    """The signer registry is unsafe or unreadable."""

    code = "registry_invalid"

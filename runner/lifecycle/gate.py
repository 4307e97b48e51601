"""Governance from settings: the verifier the lifecycle endpoints call, or none."""

from __future__ import annotations

import logging

from governance.errors import ConfigInvalid
from governance.factory import build_verifier
from governance.verifier import Verifier
from runner.floor.settings import Settings

log = logging.getLogger("quorum.governance")


def governance_from(settings: Settings) -> Verifier | None:
    """Build the verifier, or None when no registry is configured (lifecycle calls get 503).

    Raises ConfigInvalid (start-up refused) for an unsafe registry, an unreadable key or
    audit log, an audit log without its signing key (GOVERNANCE_AUDIT_KEY), or legacy mode
    switched on without its key.
    """
    if settings.governance_registry is None:
        if settings.governance_legacy_hmac:
            raise ConfigInvalid("GOVERNANCE_LEGACY_HMAC=true needs GOVERNANCE_REGISTRY")
        log.warning("no GOVERNANCE_REGISTRY: lifecycle operations are disabled")
        return None
    legacy_key = None
    if settings.governance_legacy_hmac:
        legacy_key = settings.verified_op_token_key_path
        if legacy_key is None:
            raise ConfigInvalid("GOVERNANCE_LEGACY_HMAC=true needs VERIFIED_OP_TOKEN_KEY_PATH")
    if settings.governance_audit_log is None:
        log.warning("no GOVERNANCE_AUDIT_LOG: audit records are kept in memory only")
    if settings.governance_audit_key is None and settings.governance_audit_log is None:
        log.warning("no GOVERNANCE_AUDIT_KEY: audit records are signed by a key of this process")
    try:
        return build_verifier(
            settings.governance_registry,
            settings.runner_id,
            redis_url=settings.redis_url,
            legacy_key_path=legacy_key,
            audit_path=settings.governance_audit_log,
            audit_key_path=settings.governance_audit_key,
            state_db=settings.state_db_path,
            state_db_sync=settings.state_db_sync,
            nonce_replicas=settings.nonce_replicas,
            nonce_replicas_timeout_ms=settings.nonce_replicas_timeout_ms,
        )
    except ConfigInvalid as exc:
        raise ConfigInvalid(
            f"GOVERNANCE_REGISTRY={settings.governance_registry!r}: {exc}"
        ) from None

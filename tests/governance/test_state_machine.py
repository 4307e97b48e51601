"""Hypothesis state machine over the verifier and its nonce store.

Invariants: a nonce is never approved twice; every call either approves exactly what was
asked or fails with the status the model predicts (401/403/409/503), and every call leaves
exactly one audit record.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from governance.audit import MemoryAuditSink
from governance.errors import GovernanceError, NonceStoreUnavailable
from governance.nonces import MemoryNonceStore
from governance.verifier import Approval, Verifier
from tests.governance.support import (
    A1,
    A2,
    A3,
    RUNNER,
    Clock,
    claims,
    flip_bit,
    make_registry,
    token,
)

KEYS = {"admin1": A1, "admin2": A2, "admin3": A3}
THRESHOLD = {"model-load": 2, "model-unload": 2, "cache-flush": 1}


class SwitchableStore(MemoryNonceStore):
    """The memory store, with an outage switch (Redis going away)."""

    down = False

    async def consume(self, nonce: str, ttl_s: int) -> bool:
        if self.down:
            raise NonceStoreUnavailable("store is down")
        return await super().consume(nonce, ttl_s)


@dataclass(frozen=True)
class Issued:
    doc: dict[str, Any]
    operation: str
    nonce: str
    signers: int
    issued_at: int
    expires_at: int


class VerifierMachine(RuleBasedStateMachine):
    tokens = Bundle("tokens")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = Clock()
        self.store = SwitchableStore(self.clock)
        self.audit = MemoryAuditSink(maxlen=100_000)
        self.verifier = Verifier(make_registry(), self.store, self.audit, RUNNER, self.clock)
        self.approved: list[str] = []
        self.calls = 0

    def teardown(self) -> None:
        self.loop.close()

    @rule(
        target=tokens,
        operation=st.sampled_from(sorted(THRESHOLD)),
        signers=st.lists(st.sampled_from(sorted(KEYS)), min_size=1, max_size=3, unique=True)
        | st.just(["admin1", "admin2"]),
        ttl=st.just(300) | st.integers(min_value=1, max_value=300),
        skew=st.just(0) | st.integers(min_value=-40, max_value=40),
    )
    def issue(self, operation: str, signers: list[str], ttl: int, skew: int) -> Issued:
        issued_at = int(self.clock.now) + skew
        body = claims(
            operation=operation,
            modelId="m",
            params={},
            issuedAt=issued_at,
            expiresAt=issued_at + ttl,
        )
        doc = token(body, keys=tuple(KEYS[s] for s in signers))
        return Issued(doc, operation, str(body["nonce"]), len(signers), issued_at, issued_at + ttl)

    @rule(issued=tokens, forge=st.sampled_from([False, False, False, True]))
    def present(self, issued: Issued, forge: bool) -> None:
        self.call(issued, issued.operation, forge)

    @rule(issued=tokens, as_operation=st.sampled_from(sorted(THRESHOLD)))
    def present_for_other_operation(self, issued: Issued, as_operation: str) -> None:
        self.call(issued, as_operation, forge=False)

    def call(self, issued: Issued, as_operation: str, forge: bool) -> None:
        doc = issued.doc
        if forge:
            first = dict(doc["signatures"][0])
            first["signature"] = flip_bit(first["signature"])
            doc = {**doc, "signatures": [first, *doc["signatures"][1:]]}
        expected = self.expect(issued, as_operation, forge)
        self.calls += 1
        try:
            approval = self.loop.run_until_complete(
                self.verifier.authorize(doc, as_operation, "m", {})
            )
        except GovernanceError as exc:
            assert exc.status == expected, (exc.status, expected, str(exc))
            return
        assert expected == 200, f"approved, model expected {expected}"
        assert isinstance(approval, Approval) and approval.operation == as_operation
        self.approved.append(issued.nonce)

    def expect(self, issued: Issued, as_operation: str, forge: bool) -> int:
        """The documented outcome, checked in the verifier's step order."""
        now = self.clock.now
        if forge:
            return 401
        if issued.signers < THRESHOLD[as_operation]:
            return 403
        if issued.operation != as_operation:
            return 403
        if (
            issued.issued_at > now + 30
            or issued.issued_at < now - 330
            or now >= issued.expires_at + 30
        ):
            return 401
        if self.store.down:
            return 503
        if issued.nonce in self.approved:
            return 409
        return 200

    @rule(seconds=st.integers(min_value=0, max_value=20) | st.integers(min_value=0, max_value=400))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule(down=st.sampled_from([False, False, True]))
    def set_store(self, down: bool) -> None:
        self.store.down = down

    @invariant()
    def nonce_never_approved_twice(self) -> None:
        assert len(self.approved) == len(set(self.approved))

    @invariant()
    def every_call_is_audited(self) -> None:
        assert len(self.audit.records) == self.calls


TestVerifierStateMachine = VerifierMachine.TestCase
TestVerifierStateMachine.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None
)

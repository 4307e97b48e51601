"""The share of MAX_CONNECTIONS kept for authenticated clients
(AUTHENTICATED_CONNECTION_SHARE), so that unauthenticated clients holding idle sockets,
from however many addresses, cannot take every connection the runner allows (Envoy's
overload manager keeps a reserve the same way).

Connections that have not proven who they are may hold MAX_CONNECTIONS less the reserve
(`limit - reserve`). Past that, a new connection is still accepted, on probation: its
first request must carry a proof, what the data path's identity accepts (keys mode: a
valid API key; gateway mode: a trusted peer and/or the gateway's secret), else it is
answered 503 too_many_connections and closed (a wrong key counts as a failed
authentication for its source, as on any path). A connection on probation that has not
sent a whole request head yet is the first to go when MAX_CONNECTIONS are open: the
oldest one is cut, unanswered, to make room for the newcomer. In open mode (or with
ENABLE_MULTI_TENANT=false) nothing proves anything, and there is no reserve.

A connection in the unauthenticated share is never asked for a proof (no work on the data
path); it just counts there until it closes. Counted on the event loop only, at a
connection's opening, its first request on probation, and its loss.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, MutableMapping
from typing import Any, Protocol

from faults import QuorumError

Scope = MutableMapping[str, Any]
Prove = Callable[[Scope], object]
"""Raises (a `QuorumError`) unless the request's headers prove who sent it."""


class Admit(enum.Enum):
    ACCEPT = "accept"  # in the unauthenticated share
    PROBATION = "probation"  # in the reserve: its first request must prove who it is
    REFUSE = "refuse"  # 503 too_many_connections


class Cuttable(Protocol):
    def cut(self) -> None:
        """Close at once, unanswered (a connection on probation that has not spoken)."""


class ConnectionShare:
    """Open connections against MAX_CONNECTIONS, and those not proven against its share."""

    def __init__(self, limit: int, reserve: int = 0, prove: Prove | None = None) -> None:
        """`limit`: MAX_CONNECTIONS; `reserve`: connections kept for authenticated
        clients (0, or no `prove`: none)."""
        self.limit = limit
        self.prove = prove
        self.reserve = reserve if prove is not None else 0
        self.open = 0  # open connections, less those cut to make room (not yet lost)
        self.unproven = 0  # of them, those that have not proven who they are
        self.waiting: dict[Cuttable, None] = {}  # on probation, head not read; oldest first

    def opened(self, conn: Cuttable, refused: bool = False) -> Admit:
        """Count `conn`, just opened; `refused`: it is refused already (its address is past
        MAX_CONNECTIONS_PER_SOURCE).

        1. Counted, as not proven.
        2. Refused already: REFUSE (it makes no room for itself).
        3. Past `limit`: the oldest connection on probation that has not sent a head is
           cut (and no longer counted); none: REFUSE.
        4. Past the unauthenticated share (`limit - reserve`): PROBATION.
        5. Else ACCEPT.
        """
        self.open += 1  # 1
        self.unproven += 1
        if refused:  # 2
            return Admit.REFUSE
        if self.open > self.limit:  # 3
            if not self.waiting:
                return Admit.REFUSE
            oldest = next(iter(self.waiting))
            del self.waiting[oldest]
            self.open -= 1
            self.unproven -= 1
            oldest.cut()
        if self.unproven > self.limit - self.reserve:  # 4
            self.waiting[conn] = None
            return Admit.PROBATION
        return Admit.ACCEPT  # 5

    def heard(self, conn: Cuttable, scope: Scope) -> bool:
        """The first request head of `conn`, on probation: whether it proves who sent it
        (then it no longer counts as unproven). Either way it is no longer cut to make
        room."""
        del self.waiting[conn]
        assert self.prove is not None  # no reserve without a proof
        try:
            self.prove(scope)
        except QuorumError:  # the identity's refusal (400, 401, 403, 429): no proof
            return False
        self.unproven -= 1
        return True

    def lost(self, conn: Cuttable, proven: bool, cut: bool) -> None:
        """`conn` is gone (`proven`: it proved who it is; `cut`: to make room, already
        uncounted)."""
        self.waiting.pop(conn, None)
        if cut:
            return
        self.open -= 1
        if not proven:
            self.unproven -= 1

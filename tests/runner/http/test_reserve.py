"""The share of MAX_CONNECTIONS kept for authenticated clients (runner/http/reserve.py),
driven without a server: connections are plain objects that record being cut."""

from __future__ import annotations

from faults import QuorumError
from runner.http.reserve import Admit, ConnectionShare, Scope

KEY = b"right"


class Conn:
    def __init__(self) -> None:
        self.was_cut = False

    def cut(self) -> None:
        self.was_cut = True


def _prove(scope: Scope) -> object:
    if (b"authorization", KEY) not in scope["headers"]:
        raise QuorumError("no proof")
    return "acme"


def _scope(key: bytes | None) -> Scope:
    return {"headers": [(b"authorization", key)] if key else [], "client": ("10.0.0.1", 1)}


def test_reserve_past_the_unauthenticated_share_is_on_probation() -> None:
    """With 4 allowed and 1 kept, the first 3 are accepted; the 4th is on probation."""
    share = ConnectionShare(4, 1, _prove)
    assert [share.opened(Conn()) for _ in range(4)] == [Admit.ACCEPT] * 3 + [Admit.PROBATION]


def test_reserve_a_proof_frees_a_place_in_the_unauthenticated_share() -> None:
    """A connection on probation that proves who it is no longer counts as unproven."""
    share = ConnectionShare(4, 1, _prove)
    conns = [Conn() for _ in range(4)]
    for conn in conns:
        share.opened(conn)
    assert share.heard(conns[3], _scope(KEY))
    assert share.unproven == 3 and share.open == 4


def test_reserve_no_proof_stays_unproven() -> None:
    """A wrong or missing key proves nothing: the connection stays counted as unproven."""
    share = ConnectionShare(4, 1, _prove)
    conns = [Conn() for _ in range(4)]
    for conn in conns:
        share.opened(conn)
    assert not share.heard(conns[3], _scope(b"wrong"))
    assert share.unproven == 4


def test_reserve_full_cuts_the_oldest_silent_probation() -> None:
    """At MAX_CONNECTIONS, a newcomer cuts the oldest connection on probation that sent no
    head yet, and is itself on probation; with none to cut, it is refused."""
    share = ConnectionShare(4, 2, _prove)
    conns = [Conn() for _ in range(4)]
    for conn in conns:
        share.opened(conn)
    newcomer = Conn()
    assert share.opened(newcomer) is Admit.PROBATION
    assert conns[2].was_cut and not conns[3].was_cut
    share.lost(conns[2], proven=False, cut=True)
    assert share.heard(conns[3], _scope(KEY)) and share.heard(newcomer, _scope(KEY))
    assert share.opened(Conn()) is Admit.REFUSE
    assert share.open == 5 and share.unproven == 3


def test_reserve_without_a_proof_keeps_nothing() -> None:
    """Open mode (no proof): every connection up to MAX_CONNECTIONS is accepted."""
    share = ConnectionShare(3, 2, None)
    assert [share.opened(Conn()) for _ in range(4)] == [Admit.ACCEPT] * 3 + [Admit.REFUSE]


def test_reserve_refused_by_its_address_cuts_nobody() -> None:
    """A connection its address's cap refuses makes no room for itself."""
    share = ConnectionShare(2, 1, _prove)
    first, second = Conn(), Conn()
    share.opened(first)
    share.opened(second)
    assert share.opened(Conn(), refused=True) is Admit.REFUSE
    assert not second.was_cut


def test_reserve_lost_connections_are_uncounted() -> None:
    """Closing connections gives their places back, proven or not."""
    share = ConnectionShare(4, 1, _prove)
    conns = [Conn() for _ in range(4)]
    for conn in conns:
        share.opened(conn)
    share.heard(conns[3], _scope(KEY))
    share.lost(conns[3], proven=True, cut=False)
    share.lost(conns[0], proven=False, cut=False)
    assert share.open == 2 and share.unproven == 2 and not share.waiting

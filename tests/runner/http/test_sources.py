"""runner/http/sources.py: open connections per source address."""

from __future__ import annotations

import ipaddress

from runner.http.sources import SourceCounts


def test_sources_past_the_cap_only_that_address() -> None:
    """The connection past an address's cap is refused; other addresses are not; a
    closed one frees its place."""
    counts = SourceCounts(2)
    assert [counts.opened("10.0.0.1") for _ in range(3)] == [False, False, True]
    assert counts.opened("10.0.0.2") is False
    counts.closed("10.0.0.1")
    counts.closed("10.0.0.1")
    assert counts.opened("10.0.0.1") is False
    assert counts.open == {"10.0.0.1": 2, "10.0.0.2": 1}


def test_sources_trusted_peers_and_no_cap() -> None:
    """A trusted peer (the gateway) is never capped; a cap of 0 caps nobody."""
    counts = SourceCounts(1, (ipaddress.ip_network("10.1.0.0/16"),))
    assert [counts.opened("10.1.2.3") for _ in range(3)] == [False, False, False]
    assert [counts.opened("10.2.0.1") for _ in range(2)] == [False, True]
    assert not any(SourceCounts(0).opened("10.0.0.1") for _ in range(100))


def test_sources_forget_an_address_with_nothing_open() -> None:
    """Memory holds only addresses with connections open."""
    counts = SourceCounts(4)
    counts.opened("10.0.0.1")
    counts.closed("10.0.0.1")
    assert counts.open == {}

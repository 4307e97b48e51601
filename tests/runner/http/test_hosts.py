"""The Host allow-list (runner/http/hosts.py), decided without a server."""

from __future__ import annotations

import pytest

from runner.http.hosts import HostAllowList, allowed_hosts


def _allows(hosts: HostAllowList, value: bytes) -> bool:
    return hosts.allows([(b"host", value), (b"user-agent", b"test")])


@pytest.mark.parametrize(
    "value",
    [b"127.0.0.1:8080", b"LOCALHOST", b"[::1]:8080", b"10.244.1.7", b"quorum.example.:443"],
)
def test_hosts_addresses_loopback_and_listed_names_are_allowed(value: bytes) -> None:
    """Any IP address, `localhost` and a listed name (port, case, a final dot aside)."""
    assert _allows(HostAllowList(allowed_hosts("quorum.example", "0.0.0.0") or ()), value)


@pytest.mark.parametrize("value", [b"rebind.example", b"a.localhost", b"evilrunners.example"])
def test_hosts_other_names_are_refused(value: bytes) -> None:
    """A name that is not listed, nor under a listed suffix, is refused."""
    assert not _allows(HostAllowList(allowed_hosts(".runners.example", "0.0.0.0") or ()), value)


def test_hosts_a_suffix_allows_the_domain_and_its_subdomains() -> None:
    """`.runners.example` allows `runners.example` and `a.runners.example`."""
    hosts = HostAllowList([".runners.example"])
    assert _allows(hosts, b"runners.example") and _allows(hosts, b"a.b.runners.example:80")


def test_hosts_the_bound_name_is_allowed() -> None:
    """HOST, when a name, is allowed without listing it."""
    assert _allows(HostAllowList(allowed_hosts("", "runner.internal") or ()), b"runner.internal")


def test_hosts_star_turns_the_check_off() -> None:
    """`*` anywhere in ALLOWED_HOSTS: no list at all."""
    assert allowed_hosts("a.example, *", "0.0.0.0") is None


def test_hosts_a_request_without_host_is_allowed() -> None:
    """No browser sends a request without Host: it is not refused."""
    assert HostAllowList([]).allows([(b"user-agent", b"curl")])


def test_hosts_the_first_host_decides() -> None:
    """The first Host header is the one checked."""
    hosts = HostAllowList([])
    assert not hosts.allows([(b"host", b"rebind.example"), (b"host", b"localhost")])

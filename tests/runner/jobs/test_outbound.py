"""Where a webhook may go (runner/jobs/outbound.py): internal addresses refused, the
operator's allow-list, the runner's own endpoints always refused, the checked address
pinned."""

from __future__ import annotations

import ipaddress

import pytest

from runner.jobs.errors import InvalidWebhook
from runner.jobs.outbound import (
    AddressNotAllowed,
    AllowList,
    OutboundPolicy,
    embedded_ipv4,
    internal,
)

pytestmark = pytest.mark.timeout(10)


def resolver(*addresses: str):  # type: ignore[no-untyped-def]
    async def resolve(host: str, port: int) -> list[str]:
        return list(addresses)

    return resolve


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "127.9.9.9", "10.0.0.1", "172.16.0.1", "192.168.1.1", "100.64.0.1",
        "169.254.169.254", "0.0.0.0", "224.0.0.1", "240.0.0.1", "::1", "::", "fd00::1",
        "fe80::1", "fd00:ec2::254", "::ffff:127.0.0.1", "2002:7f00:1::1", "64:ff9b::a00:1",
    ],
)  # fmt: skip
def test_outbound_internal_addresses(address: str) -> None:
    """Loopback, private, CGNAT, link-local (metadata), unspecified, multicast, reserved,
    unique-local, and IPv4 inside IPv6 (mapped, 6to4, NAT64) are internal."""
    assert internal(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_outbound_public_addresses(address: str) -> None:
    """Public addresses are not internal."""
    assert not internal(ipaddress.ip_address(address))


def test_outbound_embedded_ipv4() -> None:
    """The IPv4 address an IPv6 one carries is what is judged."""
    assert str(embedded_ipv4(ipaddress.ip_address("::ffff:10.1.2.3"))) == "10.1.2.3"
    assert str(embedded_ipv4(ipaddress.ip_address("64:ff9b::808:808"))) == "8.8.8.8"


async def test_outbound_check_refuses_internal_and_names_why() -> None:
    """A name resolving to any internal address is 400 invalid_webhook; a public one passes
    and is pinned (the URL with the address, the name kept for Host)."""
    with pytest.raises(InvalidWebhook, match="inside the runner's network"):
        await OutboundPolicy(resolve=resolver("93.184.216.34", "10.0.0.1")).check("http://a.test/")
    target = await OutboundPolicy(resolve=resolver("93.184.216.34")).check(
        "https://a.test:8443/hook?x=1"
    )
    assert target.pinned_url == "https://93.184.216.34:8443/hook?x=1"
    assert (target.host, target.host_header, target.port) == ("a.test", "a.test:8443", 8443)
    v6 = await OutboundPolicy().check("http://[2606:4700:4700::1111]/h")
    assert v6.pinned_url == "http://[2606:4700:4700::1111]:80/h"


async def test_outbound_unresolvable_name_is_400() -> None:
    """A name that does not resolve is refused at submission."""

    async def fails(host: str, port: int) -> list[str]:
        raise OSError("no such name")

    with pytest.raises(InvalidWebhook, match="does not resolve"):
        await OutboundPolicy(resolve=fails).check("http://nowhere.test/")


async def test_outbound_allow_list_admits_networks_names_and_suffixes() -> None:
    """WEBHOOK_ALLOW_HOSTS admits CIDRs, exact names and *.suffix names; bad entries are a
    ValueError naming them."""
    allow = AllowList.parse("10.1.0.0/16, hooks.internal, *.corp.test")
    policy = OutboundPolicy(allow=allow, resolve=resolver("10.9.9.9"))
    await OutboundPolicy(allow=allow, resolve=resolver("10.1.2.3")).check("http://x.test/")
    await policy.check("http://hooks.internal/")
    await policy.check("http://a.b.corp.test/")
    with pytest.raises(InvalidWebhook):
        await policy.check("http://corp.test/")
    with pytest.raises(ValueError, match="'a b'"):
        AllowList.parse("a b")


async def test_outbound_own_endpoints_refused_even_when_allowed() -> None:
    """The runner's engines and ports are refused on every loopback form, allow-list or
    not; another loopback port passes when loopback is allowed."""
    policy = OutboundPolicy(
        allow=AllowList.parse("127.0.0.0/8,::1/128"),
        own_endpoints=lambda: [("127.0.0.1", 8188), ("comfy.local", 9000)],
        resolve=resolver("127.0.0.1"),
    )
    for url in (
        "http://127.0.0.1:8188/interrupt",
        "http://127.0.0.2:8188/free",
        "http://[::1]:8188/queue",
        "http://localhost:8188/",
        "http://comfy.local:9000/",
    ):
        with pytest.raises(InvalidWebhook, match="this runner or one of its engines"):
            await policy.check(url)
    await policy.check("http://127.0.0.1:9999/hook")
    with pytest.raises(AddressNotAllowed):
        await policy.pin("http://127.0.0.1:8188/")

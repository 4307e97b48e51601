"""Where the runner may send a request a tenant asked for (a job's webhook): never inside its
own network unless the operator says so, never at its own engines.

OWASP's SSRF rules, in order (`OutboundPolicy.check`, at submission; `pin`, before each
delivery):

    1. the URL's shape (`validate_webhook_url`: http(s), a host, no credentials);
    2. resolve the host (an address literal resolves to itself; a name, by DNS, every
       address it has);
    3. each address must be public: not loopback, private (RFC 1918, CGNAT), link-local
       (the cloud metadata address 169.254.169.254 among them), unique-local (fc00::/7,
       fd00:ec2::254 too), multicast, unspecified or reserved; an IPv6 address carrying an
       IPv4 one (mapped, 6to4, NAT64) is judged by the IPv4 address;
    4. unless the operator's allow-list (WEBHOOK_ALLOW_HOSTS: CIDRs, host names, and
       `*.suffix` names) admits the name or the address;
    5. and never an endpoint of the runner itself (its engines, its own ports), allow-list
       or not.

The delivery connects to the address that was checked (pinned; the URL's name stays in
`Host` and in TLS's server name), so a name that resolves elsewhere a second time (DNS
rebinding) cannot move it. The resolver is injected (tests, and `loop.getaddrinfo` in the
runner).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from runner.floor.setting_texts import Network, parse_allow_hosts
from runner.jobs.errors import InvalidWebhook

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]
"""`resolve(host, port)`: every address the host has (strings), or OSError."""
Endpoints = Callable[[], Collection[tuple[str, int]]]
"""The runner's own (address, port) pairs, asked at each check (engines come and go)."""

WEBHOOK_URL_MAX = 2048
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class AddressNotAllowed(Exception):
    """The URL resolves (now) to an address the policy refuses."""


def validate_webhook_url(url: str) -> str:
    """The URL as given when its shape is one a job may post to; InvalidWebhook (400) saying
    why otherwise (where it points is `OutboundPolicy.check`'s).

    1. At most WEBHOOK_URL_MAX characters, no spaces or control characters.
    2. The scheme is http or https.
    3. It names a host (and a valid port, if any).
    4. It carries no user name or password (they would be stored and shown with the job).
    """
    if len(url) > WEBHOOK_URL_MAX:  # 1.
        raise InvalidWebhook(f"webhook URL is longer than {WEBHOOK_URL_MAX} characters")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise InvalidWebhook("webhook URL contains spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError when out of range or not a number
    except ValueError as exc:
        raise InvalidWebhook(f"webhook URL is malformed: {exc}") from None
    if parts.scheme.lower() not in ("http", "https"):  # 2.
        raise InvalidWebhook(
            f"webhook URL must use http or https, not {parts.scheme or 'no scheme'!r}"
        )
    if not parts.hostname or port == 0:  # 3.
        raise InvalidWebhook("webhook URL names no host")
    if parts.username is not None or parts.password is not None:  # 4.
        raise InvalidWebhook("webhook URL must not carry a user name or password")
    return url


async def system_resolve(host: str, port: int) -> list[str]:
    """The host's addresses by the system resolver, without blocking the event loop."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return [str(info[4][0]) for info in infos]


def embedded_ipv4(address: Address) -> Address:
    """The IPv4 address an IPv6 address carries (mapped, 6to4, NAT64), else the address."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def internal(address: Address) -> bool:
    """Whether `address` lies inside a private network (step 3)."""
    address = embedded_ipv4(address)
    return (
        address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_multicast
        or address.is_unspecified
        or address.is_reserved
        or (isinstance(address, ipaddress.IPv4Address) and address in _CGNAT)
    )


@dataclass(frozen=True, slots=True)
class AllowList:
    """WEBHOOK_ALLOW_HOSTS: networks, exact host names, and `*.suffix` name patterns."""

    networks: tuple[Network, ...] = ()
    names: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> AllowList:
        """Comma-separated entries (`runner/floor/setting_texts.parse_allow_hosts`, which
        checks the setting at start-up); ValueError names a bad one."""
        networks, names, suffixes = parse_allow_hosts(text)
        return cls(tuple(networks), frozenset(names), tuple(suffixes))

    def admits(self, host: str, address: Address) -> bool:
        host = host.lower()
        if host in self.names or any(host.endswith(s) for s in self.suffixes):
            return True
        candidates = {address, embedded_ipv4(address)}
        return any(
            a in net for net in self.networks for a in candidates if a.version == net.version
        )


@dataclass(frozen=True, slots=True)
class _Own:
    """The runner's own endpoints: by address, by name, and the ports it holds on loopback."""

    addresses: frozenset[tuple[str, int]]
    names: frozenset[tuple[str, int]]
    loopback_ports: frozenset[int]

    def hits(self, host: str, address: Address, port: int) -> bool:
        plain = embedded_ipv4(address)
        if (host.lower(), port) in self.names or (str(plain), port) in self.addresses:
            return True
        local = plain.is_loopback or plain.is_unspecified
        return local and port in self.loopback_ports


def _endpoints(pairs: Collection[tuple[str, int]]) -> _Own:
    addresses, names, loopback = set(), set(), set()
    for host, port in pairs:
        try:
            address = embedded_ipv4(ipaddress.ip_address(host.strip("[]")))
        except ValueError:
            names.add((host.lower(), port))
            if host.lower() == "localhost":
                loopback.add(port)
            continue
        addresses.add((str(address), port))
        if address.is_loopback or address.is_unspecified:
            loopback.add(port)
    return _Own(frozenset(addresses), frozenset(names), frozenset(loopback))


@dataclass(frozen=True, slots=True)
class Target:
    """A checked URL: the address to connect to, and what to ask it for."""

    url: str  # as the tenant gave it
    host: str  # the URL's host name (TLS server name)
    host_header: str  # the URL's host and, when not the scheme's default, port
    port: int
    address: str  # the checked address the connection goes to
    pinned_url: str  # the URL with `address` in place of the host


class OutboundPolicy:
    """Steps 1-5 of the module docstring."""

    def __init__(
        self,
        *,
        allow: AllowList | None = None,
        own_endpoints: Endpoints = tuple,
        resolve: Resolver = system_resolve,
    ) -> None:
        self.allow = allow or AllowList()
        self.own_endpoints = own_endpoints
        self.resolve = resolve

    async def check(self, url: str) -> Target:
        """At submission: the target, or InvalidWebhook (400) saying why."""
        try:
            return await self.pin(url)
        except AddressNotAllowed as exc:
            raise InvalidWebhook(str(exc)) from None
        except OSError:
            raise InvalidWebhook("webhook host does not resolve") from None

    async def pin(self, url: str) -> Target:
        """Before a delivery: the target to connect to; AddressNotAllowed if the host now
        resolves somewhere refused, OSError if it does not resolve."""
        parts = urlsplit(validate_webhook_url(url))  # 1
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
        try:  # 2
            addresses = [ipaddress.ip_address(host)]
        except ValueError:
            resolved = await self.resolve(host, port)
            addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in resolved]
        if not addresses:
            raise OSError("no address")
        own = _endpoints(self.own_endpoints())
        for address in addresses:
            if internal(address) and not self.allow.admits(host, address):  # 3, 4
                raise AddressNotAllowed(
                    "webhook URL points inside the runner's network (loopback, private, "
                    "link-local or unique-local addresses are refused; WEBHOOK_ALLOW_HOSTS "
                    "admits what the operator trusts)"
                )
            if own.hits(host, address, port):  # 5
                raise AddressNotAllowed("webhook URL points at this runner or one of its engines")
        chosen = addresses[0]
        literal = f"[{chosen}]" if chosen.version == 6 else str(chosen)
        netloc = f"{literal}:{port}"
        pinned = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
        named = parts.netloc.rpartition("@")[2]  # as written: [v6], name, name:port
        return Target(url, host, named, port, str(chosen), pinned)

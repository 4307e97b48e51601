"""Which `Host` a request may name (ALLOWED_HOSTS): DNS-rebinding protection, as Django's
ALLOWED_HOSTS or Starlette's TrustedHostMiddleware, checked in the connection's protocol
(runner/http/limits.py) before any route runs.

A web page at a name its owner controls can re-point that name at 127.0.0.1, or at a
runner on the visitor's network, and the browser then sends it requests as if to the
page's own origin, and reads the answers: the runner would serve them, `Host: evil.example`
and all. So a request is answered only when its Host (port aside, any case) is

1. an IP address (a rebinding page always names itself, never a bare address; Kubernetes
   probes and fleet routers address pods by IP),
2. a loopback name (`localhost`), or the name the runner binds (HOST, when a name),
3. a name in ALLOWED_HOSTS, or under one of its `.suffix` entries,

or when it sends no Host at all (no browser does); anything else is 400 `invalid_host`
with `Connection: close`. `ALLOWED_HOSTS=*` turns the check off: for a runner no browser
can reach except through a gateway that checks the name itself (deploy/k8s).

Cost on the data path: the Host header is found by a scan that stops at it (clients send
it first) and a set lookup of its raw bytes; only a value not seen before is parsed (then
remembered when allowed, at most `_REMEMBERED` of them).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

LOOPBACK_NAMES = ("localhost",)
_REMEMBERED = 1024


class HostAllowList:
    """The Host values a runner answers (see the module docstring)."""

    def __init__(self, names: Iterable[str]) -> None:
        """`names`: exact names, and `.suffix` entries for a domain and its subdomains."""
        entries = {name.strip().lower().rstrip(".") for name in names if name.strip()}
        self.suffixes = tuple(e for e in entries if e.startswith("."))
        self.names = frozenset(e for e in entries if not e.startswith(".")) | {
            s[1:] for s in self.suffixes
        }
        self._seen: set[bytes] = set()

    def allows(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether a request with these headers (names lower-case) may be answered.

        1. The first Host header; none: allowed (no browser sends none).
        2. A value seen and allowed before: allowed.
        3. Its name, port and brackets aside, lower-case: an IP address, a loopback or
           listed name, or under a listed suffix: allowed (remembered).
        4. Else refused.
        """
        for name, value in headers:  # 1
            if name == b"host":
                return value in self._seen or self._check(value)  # 2, 3, 4
        return True

    def _check(self, value: bytes) -> bool:
        if not self._allowed(_name_of(value)):
            return False
        if len(self._seen) < _REMEMBERED:
            self._seen.add(value)
        return True

    def _allowed(self, name: str) -> bool:
        if name in self.names or name in LOOPBACK_NAMES:
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return any(name.endswith(suffix) for suffix in self.suffixes)
        return True


def _name_of(value: bytes) -> str:
    """The host name of a Host value: `[::1]:8080` -> `::1`, `Example.COM.:80` ->
    `example.com`."""
    text = value.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1 : text.find("]")] if "]" in text else text
    return text.rpartition(":")[0].rstrip(".") if ":" in text else text.rstrip(".")


def allowed_hosts(setting: str, bind_host: str) -> tuple[str, ...] | None:
    """ALLOWED_HOSTS as the names `HostAllowList` takes: its entries and HOST (when an
    address, such as 0.0.0.0, allowed anyway); None for `*` (no check)."""
    entries = [e.strip() for e in setting.split(",") if e.strip()]
    if "*" in entries:
        return None
    return (*entries, bind_host)

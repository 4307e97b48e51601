"""The settings' own small languages: the texts of OBJECTIVE_PRIORITIES, ALLOWED_HOSTS and
WEBHOOK_ALLOW_HOSTS, parsed here for `Settings`' validators and for the rooms that read
them again (runner/http/headers.py, runner/jobs/outbound.py). Pure: no environment read.
"""

from __future__ import annotations

import ipaddress
import re

DEFAULT_OBJECTIVE_PRIORITIES = (
    "high=high,normal=normal,low=low,critical=high,standard=normal,sheddable=low"
)
"""OBJECTIVE_PRIORITIES' default: the InferenceObjectives of deploy/k8s/ (high, normal, low)
and the Inference Extension's older criticality names (Critical, Standard, Sheddable)."""

PRIORITIES = ("high", "normal", "low")
"""The priority bands a request may ask for (X-Priority, OBJECTIVE_PRIORITIES)."""

HOST_ENTRY = re.compile(r"\.?[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?|\[?[0-9A-Fa-f:.]+\]?")
"""An ALLOWED_HOSTS entry: a name or an IPv4 address, a `.suffix`, an IPv6 address."""


def parse_objective_priorities(text: str) -> dict[bytes, str]:
    """`name=priority,...` (an InferenceObjective's name, one of high, normal, low) as the
    table the request headers are read with (runner/http/headers.py); names are
    case-insensitive. ValueError names the bad entry."""
    table: dict[bytes, str] = {}
    for entry in text.split(","):
        if not entry.strip():
            continue
        name, sep, priority = (part.strip().lower() for part in entry.partition("="))
        if not sep or not name or not name.isascii() or priority not in PRIORITIES:
            raise ValueError(f"{entry.strip()!r} is not <objective>=high|normal|low")
        table[name.encode()] = priority
    return table


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_allow_hosts(text: str) -> tuple[list[Network], set[str], list[str]]:
    """WEBHOOK_ALLOW_HOSTS, comma-separated: (networks, exact host names, `.suffix`es of
    `*.suffix` entries), lower-cased (runner/jobs/outbound.AllowList). ValueError names a
    bad entry."""
    networks: list[Network] = []
    names: set[str] = set()
    suffixes: list[str] = []
    for part in (p.strip().lower() for p in text.split(",")):
        if not part:
            continue
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
            continue
        except ValueError:
            pass
        if part.startswith("*.") and len(part) > 2:
            suffixes.append(part[1:])
        elif all(c.isalnum() or c in "-." for c in part):
            names.add(part)
        else:
            raise ValueError(f"{part!r} is not a CIDR, a host name or *.suffix")
    return networks, names, suffixes

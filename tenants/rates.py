"""Rates (`100req/min`) and tenant ids: pure parsing, no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass

import limits

from tenants.errors import InvalidTenantConfig

TENANT_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""What a tenant id may be: 1-64 of letters, digits, `.`, `_`, `-`."""

UNLIMITED = "unlimited"
"""The value that exempts a tenant from every limit, including the default."""

_GRANULARITY_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
_UNITS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), "second"),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), "minute"),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), "hour"),
    **dict.fromkeys(("d", "day", "days"), "day"),
}
_SHORT = {"second": "s", "minute": "min", "hour": "hour", "day": "day"}
_RATE = re.compile(r"\s*(-?\d+)\s*(?:req|reqs|request|requests)?\s*/\s*([a-z]+)\s*", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Rate:
    """`amount` requests per `multiples` x `granularity` (second, minute, hour, day)."""

    amount: int
    granularity: str
    multiples: int = 1

    @property
    def period_s(self) -> int:
        return self.multiples * _GRANULARITY_SECONDS[self.granularity]

    @property
    def text(self) -> str:
        """Human form used in messages: `100 req/min`, `5 req/s`, `10 req/5min`."""
        short = _SHORT[self.granularity]
        per = short if self.multiples == 1 else f"{self.multiples}{short}"
        return f"{self.amount} req/{per}"

    def item(self) -> limits.RateLimitItem:
        """The `limits` item for this rate (one per tenant, built once)."""
        return limits.parse(f"{self.amount}/{self.multiples} {self.granularity}")


def parse_rate(text: str) -> Rate:
    """Parse `100req/min`, `5req/s`, `1000req/hour` (any case; also `/sec`, `/second`,
    `/minute`, `/h`, `/day`) or the `limits` library's own `100/minute`, `100 per minute`.

    Raises ValueError with a message saying what was expected.
    """
    match = _RATE.fullmatch(text)
    if match is not None:
        amount, unit = int(match.group(1)), match.group(2).lower()
        granularity = _UNITS.get(unit)
        if granularity is None:
            raise ValueError(f"unknown time unit {unit!r} in {text!r}: use s, min, hour or day")
        if amount < 1:
            raise ValueError(f"rate {text!r} must allow at least 1 request")
        return Rate(amount, granularity)
    if any(sep in text for sep in ";,|"):
        raise ValueError(f"rate {text!r} must be a single rate, not a list")
    try:
        item = limits.parse(text)
    except ValueError:
        raise ValueError(
            f"cannot parse rate {text!r}: expected '<N>req/<unit>' such as 100req/min, "
            "5req/s or 1000req/hour"
        ) from None
    if item.amount < 1:
        raise ValueError(f"rate {text!r} must allow at least 1 request")
    return Rate(item.amount, item.GRANULARITY.name, item.multiples)


def parse_limit(text: str, source: str) -> Rate | None:
    """A configured limit: a rate, or `unlimited` (None). Errors name `source`."""
    if text.strip().lower() == UNLIMITED:
        return None
    try:
        return parse_rate(text)
    except ValueError as exc:
        raise InvalidTenantConfig(f"{source}: {exc}") from None


def check_tenant_id(tenant: str, source: str) -> str:
    """Return `tenant` if it is a valid tenant id; otherwise raise, naming `source`."""
    if TENANT_ID.fullmatch(tenant) is None:
        raise InvalidTenantConfig(
            f"{source}: tenant id {tenant!r} must be 1-64 of letters, digits, '.', '_' or '-'"
        )
    return tenant

"""Parsing rates and tenant ids."""

from __future__ import annotations

import pytest

from tenants.errors import InvalidTenantConfig
from tenants.rates import Rate, check_tenant_id, parse_limit, parse_rate


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("100req/min", Rate(100, "minute")),
        ("5req/s", Rate(5, "second")),
        ("1000req/hour", Rate(1000, "hour")),
        ("5REQ/SEC", Rate(5, "second")),
        ("3req/second", Rate(3, "second")),
        ("7req/minute", Rate(7, "minute")),
        ("7 req / h", Rate(7, "hour")),
        ("2requests/day", Rate(2, "day")),
        ("100/minute", Rate(100, "minute")),
        ("100 per minute", Rate(100, "minute")),
        ("10 per 5 minutes", Rate(10, "minute", 5)),
    ],
)
def test_parse_rate_accepts_documented_forms(text: str, rate: Rate) -> None:
    """Every documented spelling parses to the same amount per period."""
    assert parse_rate(text) == rate


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0req/min", "at least 1 request"),
        ("-5req/min", "at least 1 request"),
        ("0/minute", "at least 1 request"),
        ("5req/fortnight", "unknown time unit 'fortnight'"),
        ("abc", "expected '<N>req/<unit>'"),
        ("", "expected '<N>req/<unit>'"),
        ("5req", "expected '<N>req/<unit>'"),
        ("1.5req/min", "expected '<N>req/<unit>'"),
        ("10/second;20/minute", "single rate"),
    ],
)
def test_parse_rate_rejects_junk_with_clear_message(text: str, message: str) -> None:
    """Zero, negative, unknown units and junk are refused with a message saying why."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_rate(text)


def test_rate_text_and_period() -> None:
    """A rate describes itself as in the seed's message and knows its window length."""
    assert parse_rate("100req/min").text == "100 req/min"
    assert parse_rate("5req/s").text == "5 req/s"
    assert parse_rate("10 per 5 minutes").text == "10 req/5min"
    assert parse_rate("1000req/hour").period_s == 3600
    assert parse_rate("100req/min").item().amount == 100


def test_parse_limit_unlimited_and_named_errors() -> None:
    """`unlimited` means no limit; a bad value names its source."""
    assert parse_limit("Unlimited", "X") is None
    with pytest.raises(InvalidTenantConfig, match=r"^TENANT_RATE_LIMIT_a: cannot parse"):
        parse_limit("lots", "TENANT_RATE_LIMIT_a")


@pytest.mark.parametrize("tenant", ["community-x", "a", "A.b_c-9", "x" * 64])
def test_check_tenant_id_accepts_valid_ids(tenant: str) -> None:
    """Letters, digits, '.', '_', '-', 1 to 64 of them."""
    assert check_tenant_id(tenant, "src") == tenant


@pytest.mark.parametrize("tenant", ["", "x" * 65, "a b", "a/b", "é", "a:b"])
def test_check_tenant_id_rejects_invalid_ids(tenant: str) -> None:
    """Anything else is a configuration error naming the source."""
    with pytest.raises(InvalidTenantConfig, match=r"^src: tenant id"):
        check_tenant_id(tenant, "src")

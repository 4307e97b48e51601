"""The deadline headers (`X-Request-Deadline-Ms`, llm-d's `x-llm-d-slo-ttft-ms`)."""

from __future__ import annotations

import pytest

from runner.errors import InvalidHeader
from runner.http.headers import parse_request_headers

pytestmark = pytest.mark.timeout(10)


def test_parse_deadline_absent_is_none() -> None:
    """Without either header a request has no deadline."""
    assert parse_request_headers([]).deadline_ms is None


def test_parse_deadline_reads_either_header_ours_first() -> None:
    """X-Request-Deadline-Ms is read; llm-d's TTFT objective stands in without it."""
    assert parse_request_headers([(b"x-request-deadline-ms", b"2000")]).deadline_ms == 2000
    assert parse_request_headers([(b"x-llm-d-slo-ttft-ms", b" 750 ")]).deadline_ms == 750
    both = [(b"x-llm-d-slo-ttft-ms", b"750"), (b"x-request-deadline-ms", b"2000")]
    assert parse_request_headers(both).deadline_ms == 2000


@pytest.mark.parametrize(
    ("name", "value", "named"),
    [
        (b"x-request-deadline-ms", b"0", "X-Request-Deadline-Ms"),
        (b"x-request-deadline-ms", b"-5", "X-Request-Deadline-Ms"),
        (b"x-request-deadline-ms", b"1.5", "X-Request-Deadline-Ms"),
        (b"x-request-deadline-ms", b"3600001", "X-Request-Deadline-Ms"),
        (b"x-request-deadline-ms", b"9" * 5000, "X-Request-Deadline-Ms"),
        (b"x-llm-d-slo-ttft-ms", b"soon", "x-llm-d-slo-ttft-ms"),
    ],
)
def test_parse_deadline_invalid_names_the_header(name: bytes, value: bytes, named: str) -> None:
    """A deadline that is not 1..3600000 whole milliseconds is a 400 naming its header."""
    with pytest.raises(InvalidHeader) as err:
        parse_request_headers([(name, value)])
    assert named in str(err.value) and err.value.status == 400

"""Request header validation (runner/http/headers.py)."""

from __future__ import annotations

import pytest

from runner.errors import InvalidHeader
from runner.http.headers import parse_request_headers


def test_parse_headers_defaults_when_absent() -> None:
    """No runner headers: no tenant, priority normal, cache auto, a generated request id."""
    meta = parse_request_headers([(b"content-type", b"application/json")])
    assert (meta.tenant_header, meta.priority, meta.cache_mode, meta.cache_tag) == (
        None,
        "normal",
        "auto",
        None,
    )
    assert meta.request_id.startswith("req-")


def test_parse_headers_reads_all_values() -> None:
    """Valid values are read case-insensitively where the contract allows."""
    meta = parse_request_headers(
        [
            (b"x-tenant-id", b"community-x"),
            (b"x-priority", b"HIGH"),
            (b"x-cache-mode", b"prefix"),
            (b"x-cache-tag", b"session-abc123"),
            (b"x-request-id", b"abc:1"),
            (b"content-length", b"12"),
            (b"authorization", b"Bearer k"),
        ]
    )
    assert meta.tenant_header == b"community-x" and meta.priority == "high"
    assert meta.cache_mode == "prefix" and meta.cache_tag == "session-abc123"
    assert meta.request_id == "abc:1" and meta.content_length == 12
    assert meta.authorization == b"Bearer k"


def test_parse_headers_request_ids_are_unique() -> None:
    """Generated request ids never repeat within a process."""
    ids = {parse_request_headers([]).request_id for _ in range(1000)}
    assert len(ids) == 1000


@pytest.mark.parametrize(
    ("name", "value", "named"),
    [
        (b"x-tenant-id", b"", "X-Tenant-ID"),
        (b"x-tenant-id", b"a/b", "X-Tenant-ID"),
        (b"x-tenant-id", b"t" * 65, "X-Tenant-ID"),
        (b"x-priority", b"urgent", "X-Priority"),
        (b"x-cache-mode", b"always", "X-Cache-Mode"),
        (b"x-cache-tag", b"", "X-Cache-Tag"),
        (b"x-cache-tag", b"t" * 65, "X-Cache-Tag"),
        (b"x-cache-tag", b"\xff\xfe", "X-Cache-Tag"),
        (b"x-request-id", b"has space", "X-Request-Id"),
        (b"content-length", b"ten", "Content-Length"),
    ],
)
def test_parse_headers_invalid_value_names_header(name: bytes, value: bytes, named: str) -> None:
    """Each invalid value raises InvalidHeader (400) whose message names the header."""
    with pytest.raises(InvalidHeader) as info:
        parse_request_headers([(name, value)])
    assert named in str(info.value)
    assert info.value.status == 400


def test_parse_headers_tag_of_64_chars_is_accepted() -> None:
    """X-Cache-Tag may be exactly 64 characters."""
    assert parse_request_headers([(b"x-cache-tag", b"t" * 64)]).cache_tag == "t" * 64

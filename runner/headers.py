"""Validation of the request headers the runner understands (pure).

| header        | values                    | default   |
|---------------|---------------------------|-----------|
| X-Tenant-ID   | 1-64 of [A-Za-z0-9._-]    | (none)    |
| X-Priority    | high, normal, low         | normal    |
| X-Cache-Mode  | prefix, none, auto        | auto      |
| X-Cache-Tag   | at most 64 characters     | (none)    |
| X-Request-Id  | 1-128 of [A-Za-z0-9._:-]  | generated |

A bad value raises InvalidHeader naming the header; nothing else happens.
Which tenant a request belongs to is decided after this, by
`tenants.identity.resolve_tenant` (API key or X-Tenant-ID, default `default`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from itertools import count

from runner.errors import InvalidHeader

_TENANT = re.compile(rb"[A-Za-z0-9._-]{1,64}")
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
_PRIORITIES = {b"high": "high", b"normal": "normal", b"low": "low"}
_CACHE_MODES = {b"prefix": "prefix", b"none": "none", b"auto": "auto"}
_BOOT = os.urandom(4).hex()
_SEQ = count(1)


@dataclass(frozen=True, slots=True)
class RequestMeta:
    tenant_header: bytes | None
    priority: str
    cache_mode: str
    cache_tag: str | None
    request_id: str
    authorization: bytes | None
    content_length: int | None


def new_request_id() -> str:
    """Unique per process life: a random boot prefix and a counter (cheap)."""
    return f"req-{_BOOT}-{next(_SEQ)}"


def parse_request_headers(raw: list[tuple[bytes, bytes]]) -> RequestMeta:
    """Read the runner's headers from ASGI raw headers (lower-case names).

    1. Collect the headers of interest in one pass; the last value of a repeated header wins.
    2. Validate each present value; an invalid one raises InvalidHeader naming it.
    3. Fill defaults for absent ones.
    """
    tenant = priority = mode = tag = rid = auth = length = None
    for name, value in raw:  # 1
        if not name.startswith(b"x-"):
            if name == b"content-length":
                length = value
            elif name == b"authorization":
                auth = value
            continue
        if name == b"x-tenant-id":
            tenant = value
        elif name == b"x-priority":
            priority = value
        elif name == b"x-cache-mode":
            mode = value
        elif name == b"x-cache-tag":
            tag = value
        elif name == b"x-request-id":
            rid = value
    # 2, 3
    if tenant is not None and not _TENANT.fullmatch(tenant):
        raise InvalidHeader("X-Tenant-ID must be 1-64 characters of A-Z a-z 0-9 . _ -")
    if priority is None:
        priority_s = "normal"
    else:
        p = _PRIORITIES.get(priority.strip().lower())
        if p is None:
            raise InvalidHeader("X-Priority must be one of high, normal, low")
        priority_s = p
    if mode is None:
        mode_s = "auto"
    else:
        m = _CACHE_MODES.get(mode.strip().lower())
        if m is None:
            raise InvalidHeader("X-Cache-Mode must be one of prefix, none, auto")
        mode_s = m
    tag_s = None
    if tag is not None:
        try:
            tag_s = tag.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidHeader("X-Cache-Tag must be UTF-8 text") from None
        if not tag_s or len(tag_s) > 64:
            raise InvalidHeader("X-Cache-Tag must be 1-64 characters")
    if rid is None:
        rid_s = new_request_id()
    elif _REQUEST_ID.fullmatch(rid):
        rid_s = rid.decode()
    else:
        raise InvalidHeader("X-Request-Id must be 1-128 characters of A-Z a-z 0-9 . _ : -")
    length_i = None
    if length is not None:
        try:
            length_i = int(length)
        except ValueError:
            raise InvalidHeader("Content-Length must be an integer") from None
        if length_i < 0:
            raise InvalidHeader("Content-Length must not be negative")
    return RequestMeta(tenant, priority_s, mode_s, tag_s, rid_s, auth, length_i)

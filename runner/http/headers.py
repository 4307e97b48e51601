"""Validation of the request headers the runner understands (pure).

| header        | values                    | default   |
|---------------|---------------------------|-----------|
| X-Tenant-ID   | 1-64 of [A-Za-z0-9._-]    | (none)    |
| X-Priority    | high, normal, low         | normal    |
| X-Cache-Mode  | prefix, none, auto        | auto      |
| X-Cache-Tag   | at most 64 characters     | (none)    |
| X-Request-Id  | 1-128 of [A-Za-z0-9._:-]  | generated |
| X-Request-Deadline-Ms | 1-3600000 (ms to the first byte) | (none) |

What a gateway in front (Kubernetes' Gateway API Inference Extension, llm-d's router)
passes on, read where the runner's own header is absent:

| header                          | read as     | values                                 |
|---------------------------------|-------------|----------------------------------------|
| x-llm-d-inference-fairness-id   | X-Tenant-ID | as X-Tenant-ID                         |
| x-llm-d-inference-objective     | X-Priority  | an InferenceObjective's name, mapped   |
|                                 |             | by OBJECTIVE_PRIORITIES (else normal)  |
| x-gateway-inference-objective   | X-Priority  | (its older name)                       |

The newer objective name wins over the older one; X-Priority wins over both. The tenant
comes from one gateway header only (the older `x-gateway-inference-fairness-id` is not
read: two names for one identity let a client pick whichever its gateway does not
overwrite). The headers that say who a request is (Authorization, X-Tenant-ID, the
fairness id, X-Quorum-Gateway-Secret) may come once: a repeated one is 400, as a proxy
may keep the client's copy beside its own.

A bad value raises InvalidHeader naming the header; nothing else happens.
Which tenant a request belongs to is decided after this, by `tenants.identity.Identity`
(by TENANT_IDENTITY: the API key, the gateway's fairness id, or X-Tenant-ID).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from itertools import count

from faults.record import record
from runner.errors import InvalidHeader
from runner.floor.setting_texts import DEFAULT_OBJECTIVE_PRIORITIES, parse_objective_priorities
from runner.http.asgi import Scope
from tenants.identity import Identity

_TENANT = re.compile(rb"[A-Za-z0-9._-]{1,64}")
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
_PRIORITIES = {b"high": "high", b"normal": "normal", b"low": "low"}
_CACHE_MODES = {b"prefix": "prefix", b"none": "none", b"auto": "auto"}
_BOOT = os.urandom(4).hex()
_SEQ = count(1)

DEFAULT_OBJECTIVES = parse_objective_priorities(DEFAULT_OBJECTIVE_PRIORITIES)


@record
class RequestMeta:
    tenant_header: bytes | None
    priority: str
    cache_mode: str
    cache_tag: str | None
    request_id: str
    authorization: bytes | None
    content_length: int | None
    fairness_id: bytes | None = None  # the gateway's tenant, validated as X-Tenant-ID
    deadline_ms: int | None = None  # X-Request-Deadline-Ms, else x-llm-d-slo-ttft-ms
    priority_asked: bool = False  # X-Priority or the gateway's objective was sent
    json_body: bool = True  # Content-Type: application/json (parameters allowed)
    gateway_secret: bytes | None = None  # X-Quorum-Gateway-Secret (gateway mode)


def new_request_id() -> str:
    """Unique per process life: a random boot prefix and a counter (cheap)."""
    return f"req-{_BOOT}-{next(_SEQ)}"


def parse_request_headers(
    raw: list[tuple[bytes, bytes]], objectives: Mapping[bytes, str] = DEFAULT_OBJECTIVES
) -> RequestMeta:
    """Read the runner's headers from ASGI raw headers (lower-case names).

    1. Collect the headers of interest in one pass; an identity header sent twice raises
       InvalidHeader; of any other repeated header the last value wins.
    2. Validate each present value; an invalid one raises InvalidHeader naming it. Without
       X-Priority, the gateway's objective names the priority through `objectives`.
    3. Fill defaults for absent ones.
    """
    tenant = priority = mode = tag = rid = auth = length = ctype = secret = None
    deadline = slo = None
    fairness = objective = old_objective = None
    for name, value in raw:  # 1
        if not name.startswith(b"x-"):
            if name == b"content-length":
                length = value
            elif name == b"authorization":
                _once(auth, "Authorization")
                auth = value
            elif name == b"content-type":
                ctype = value
            continue
        if name == b"x-tenant-id":
            _once(tenant, "X-Tenant-ID")
            tenant = value
        elif name == b"x-priority":
            priority = value
        elif name == b"x-cache-mode":
            mode = value
        elif name == b"x-cache-tag":
            tag = value
        elif name == b"x-request-id":
            rid = value
        elif name == b"x-request-deadline-ms":
            deadline = value
        elif name == b"x-llm-d-slo-ttft-ms":
            slo = value
        elif name == b"x-llm-d-inference-fairness-id":
            _once(fairness, "x-llm-d-inference-fairness-id")
            fairness = value
        elif name == b"x-llm-d-inference-objective":
            objective = value
        elif name == b"x-gateway-inference-objective":
            old_objective = value
        elif name == b"x-quorum-gateway-secret":
            _once(secret, "X-Quorum-Gateway-Secret")
            secret = value
    # 2, 3
    if tenant is not None and not _TENANT.fullmatch(tenant):
        raise InvalidHeader("X-Tenant-ID must be 1-64 characters of A-Z a-z 0-9 . _ -")
    if fairness is not None and not _TENANT.fullmatch(fairness):
        raise InvalidHeader(
            "x-llm-d-inference-fairness-id must be 1-64 characters of A-Z a-z 0-9 . _ -"
        )
    asked = priority is not None or objective is not None or old_objective is not None
    if priority is None:
        objective = objective if objective is not None else old_objective
        priority_s = "normal"
        if objective is not None:
            priority_s = objectives.get(objective.strip().lower(), "normal")
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
    deadline_ms = parse_deadline(deadline, slo)
    json_body = ctype is not None and (
        ctype == b"application/json"
        or ctype.partition(b";")[0].strip().lower() == b"application/json"
    )
    return RequestMeta(
        tenant,
        priority_s,
        mode_s,
        tag_s,
        rid_s,
        auth,
        length_i,
        fairness,
        deadline_ms,
        asked,
        json_body,
        secret,
    )


def _once(seen: bytes | None, name: str) -> None:
    """An identity header already seen: 400 (which copy counts is nobody's to guess)."""
    if seen is not None:
        raise InvalidHeader(f"{name} was sent more than once; send it once")


MAX_DEADLINE_MS = 3_600_000


def parse_deadline(deadline: bytes | None, slo: bytes | None) -> int | None:
    """Milliseconds the client waits for the first byte, if it says so.

    1. X-Request-Deadline-Ms; without it, llm-d's x-llm-d-slo-ttft-ms (its TTFT objective).
    2. An integer of 1..MAX_DEADLINE_MS (one hour); anything else raises InvalidHeader
       naming the header.
    """
    if deadline is not None:  # 1
        value, name = deadline, "X-Request-Deadline-Ms"
    elif slo is not None:
        value, name = slo, "x-llm-d-slo-ttft-ms"
    else:
        return None
    text = value.strip()  # 2
    if not text.isdigit() or len(text) > 7 or not 1 <= int(text) <= MAX_DEADLINE_MS:
        raise InvalidHeader(f"{name} must be an integer of 1-{MAX_DEADLINE_MS} milliseconds")
    return int(text)


def tenant_of(identity: Identity, scope: Scope, objectives: Mapping[bytes, str]) -> str:
    """The tenant of a request that the front-end does not serve (jobs, engine logs, the
    status page), identified exactly as an inference request is (tenants/identity.py)."""
    meta = parse_request_headers(list(scope["headers"]), objectives)
    return identity.identify(
        meta.authorization,
        meta.tenant_header,
        meta.fairness_id,
        meta.gateway_secret,
        scope.get("client"),
    )

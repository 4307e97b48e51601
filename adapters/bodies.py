"""Request bodies as the runner changes them on their way to an engine."""

from __future__ import annotations

from typing import Any

import orjson


def with_fields(body: bytes, obj: dict[str, Any], fields: dict[str, object]) -> bytes:
    """`body` (parsed: `obj`) with `fields` first.

    1. No fields: `body` itself.
    2. None of them a key of `obj` (the ones a client may send were removed by the
       adapter's `rewrite`) and a non-empty JSON object: spliced in front, no re-serializing.
    3. Otherwise `obj` updated and serialized.
    """
    if not fields:  # 1
        return body
    stripped = body.lstrip()
    clash = any(k in obj for k in fields)
    if not clash and stripped[:1] == b"{" and stripped[1:].lstrip()[:1] not in (b"}", b""):  # 2
        return b"{" + orjson.dumps(fields)[1:-1] + b"," + stripped[1:]
    return orjson.dumps({**obj, **fields})  # 3

"""Strict base64url and strict JSON: the only decoders the governance package uses.

Strict means: no padding and no non-canonical trailing bits in base64url; in JSON no
duplicate keys, no NaN/Infinity, no floats, integers inside the IEEE-754 safe range
(so every JOSE library in every language reads the same numbers), no lone surrogates,
bounded nesting. Every failure is a `ValueError` with a message that names the problem;
callers translate it into their own error class.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from typing import Any

import rfc8785

MAX_SAFE_INT = 2**53 - 1
MAX_DEPTH = 16
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def b64url_encode(data: bytes) -> str:
    """Base64url without padding (RFC 7515 §2)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Decode base64url that is exactly what `b64url_encode` would produce, or raise."""
    rest = len(text) % 4
    if rest == 1 or not _B64URL.fullmatch(text):
        raise ValueError("not strict base64url (alphabet, padding or length)")
    # Canonical form: the unused low bits of the last character must be zero.
    if rest and _ALPHABET.index(text[-1]) & (0x0F if rest == 2 else 0x03):
        raise ValueError("non-canonical base64url (trailing bits set)")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except binascii.Error as exc:  # pragma: no cover - the regex already excludes this
        raise ValueError(f"not base64url: {exc}") from exc


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate JSON key {key!r}")
        obj[key] = value
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in JSON")


def _no_float(text: str) -> Any:
    raise ValueError(f"non-integer number {text!r} is not allowed")


def _safe_int(text: str) -> int:
    value = int(text)
    if not -MAX_SAFE_INT <= value <= MAX_SAFE_INT:
        raise ValueError(f"integer {text[:24]} is out of range")
    return value


def loads_strict(data: bytes | str) -> Any:
    """Parse JSON strictly (see module docstring) and return plain Python values."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(
            text,
            object_pairs_hook=_object_pairs,
            parse_constant=_no_constant,
            parse_float=_no_float,
            parse_int=_safe_int,
        )
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc.reason}") from exc
    except ValueError as exc:  # json.JSONDecodeError and our hooks; int digit limit too
        raise ValueError(str(exc)) from exc
    # The hooks already refused duplicates, constants, floats and big integers. Lone
    # surrogates can only come from \u escapes, and nesting needs brackets: walk the
    # value only when the text could hold either (the common token has neither).
    if "\\u" in text or text.count("{") + text.count("[") > MAX_DEPTH:
        check_value(value)
    return value


def check_value(value: object, depth: int = 0) -> None:
    """Refuse anything that is not plain, safe JSON (used for already-parsed input too)."""
    if depth > MAX_DEPTH:
        raise ValueError("JSON nested too deeply")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not -MAX_SAFE_INT <= value <= MAX_SAFE_INT:
            raise ValueError(f"integer {value} is out of range")
        return
    if isinstance(value, str):
        _check_text(value)
        return
    if isinstance(value, list):
        for item in value:
            check_value(item, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError("JSON object keys must be strings")
            _check_text(key)
            check_value(item, depth + 1)
        return
    raise ValueError(f"{type(value).__name__} is not allowed here")


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("string holds a lone surrogate") from exc


def canonical(value: object) -> bytes:
    """Sorted keys, no spaces, UTF-8: the byte form used for comparison and for HMACs."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def jcs(value: object) -> bytes:
    """RFC 8785 canonical JSON (the JSON Canonicalization Scheme), with `rfc8785`: sorted
    keys by UTF-16 code units, no whitespace, ECMAScript number forms. ValueError for what
    JSON cannot hold (NaN, integers past 2^53 - 1, non-string keys)."""
    try:
        return rfc8785.dumps(value)  # type: ignore[arg-type]  # it checks the value itself
    except (rfc8785.CanonicalizationError, TypeError) as exc:
        raise ValueError(f"cannot canonicalize: {exc}") from exc


def policy_sha256(policy: object) -> str:
    """The `policySha256` a `tenant-policy` token binds: lowercase hex SHA-256 of the
    policy's RFC 8785 form (`null` for a deletion)."""
    return hashlib.sha256(jcs(policy)).hexdigest()

"""Strict base64url and strict JSON, the only decoders governance uses."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from governance.encoding import b64url_decode, b64url_encode, canonical, loads_strict


@given(st.binary(max_size=100))
def test_encoding_b64url_round_trip(data: bytes) -> None:
    """Whatever b64url_encode produces decodes back to the same bytes."""
    assert b64url_decode(b64url_encode(data)) == data


@given(st.binary(min_size=1, max_size=40))
def test_encoding_b64url_refuses_non_canonical(data: bytes) -> None:
    """Any other spelling of the same bytes (padding, set trailing bits) is refused."""
    text = b64url_encode(data)
    with pytest.raises(ValueError):
        b64url_decode(text + "=")
    if len(text) % 4:
        last = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".index(text[-1])
        twin = text[:-1] + base64.urlsafe_b64encode(bytes([0, 0, last | 1]))[-1:].decode()
        if twin != text:
            with pytest.raises(ValueError):
                b64url_decode(twin)


@pytest.mark.parametrize(
    "text",
    [
        '{"a":1,"a":1}',
        '{"a":NaN}',
        '{"a":-Infinity}',
        '{"a":1.0}',
        '{"a":1e2}',
        '{"a":9007199254740992}',
        '{"a":-9007199254740992}',
        '{"a":"\\udc00"}',
        "[" * 18 + "]" * 18,
        "1" * 5000,
        "{",
        "",
    ],
)
def test_encoding_loads_strict_refuses(text: str) -> None:
    """Duplicates, constants, floats, unsafe integers, lone surrogates, deep nesting, junk."""
    with pytest.raises(ValueError):
        loads_strict(text)


def test_encoding_loads_strict_accepts_plain_json() -> None:
    """Safe integers, escapes that form valid characters and 17 nested containers are fine."""
    assert loads_strict('{"a":9007199254740991,"b":"\\u00e9\\ud83d\\ude00"}') == {
        "a": 9007199254740991,
        "b": "é😀",
    }
    assert loads_strict("[" * 17 + "]" * 17)


def test_encoding_canonical_is_sorted_compact_utf8() -> None:
    """canonical() sorts keys, drops spaces and keeps non-ASCII as UTF-8."""
    assert canonical({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()

"""adapters.bodies.with_fields: the runner's fields go in front of a client's body."""

from __future__ import annotations

import orjson
import pytest

from adapters.bodies import with_fields

pytestmark = pytest.mark.timeout(10)


def test_fields_are_spliced_in_front_without_reserializing() -> None:
    """The runner's fields go in front of the client's body bytes, which are kept as sent."""
    body = b'{"model": "m",   "stream": true}'
    out = with_fields(body, orjson.loads(body), {"id_slot": 1, "return_progress": True})
    assert out == b'{"id_slot":1,"return_progress":true,"model": "m",   "stream": true}'


def test_no_fields_is_the_body_itself_and_an_empty_object_is_reserialized() -> None:
    """No fields: the body object itself; an empty object gets the fields as JSON."""
    body = b'{"model": "m"}'
    assert with_fields(body, orjson.loads(body), {}) is body
    assert orjson.loads(with_fields(b"{}", {}, {"id_slot": 0})) == {"id_slot": 0}


def test_a_field_the_client_also_sent_is_replaced_never_duplicated() -> None:
    """A duplicate key would leave the engine's JSON parser to pick one (llama-server's
    takes the last: the client's `return_progress: false` would win)."""
    body = b'{"model": "m", "return_progress": false}'
    out = with_fields(body, orjson.loads(body), {"return_progress": True})
    assert out.count(b"return_progress") == 1
    assert orjson.loads(out) == {"model": "m", "return_progress": True}

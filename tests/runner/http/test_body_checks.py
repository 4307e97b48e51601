"""runner/http/body_checks.py: numeric fields out of range are refused naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from runner.errors import InvalidField
from runner.http.body_checks import INT32_MAX, check_generation

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 10**12}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_completion_tokens": INT32_MAX + 1}, "max_completion_tokens"),
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"temperature": 2.01}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": -0.1}, "top_p"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ],
)
def test_check_generation_refuses_out_of_range(body: dict[str, Any], param: str) -> None:
    """A field out of its range is 400 invalid_request with `param` naming it."""
    with pytest.raises(InvalidField) as caught:
        check_generation(body, None)
    assert caught.value.status == 400 and caught.value.code == "invalid_request"
    assert caught.value.extra["param"] == param and param in str(caught.value)


def test_check_generation_accepts_in_range_and_null() -> None:
    """In-range values, and null (not given), pass."""
    check_generation(
        {
            "max_tokens": INT32_MAX,
            "max_completion_tokens": None,
            "n": 1,
            "temperature": 0,
            "top_p": 1.0,
            "presence_penalty": -2,
            "frequency_penalty": 2.0,
            "top_logprobs": 0,
        },
        None,
    )


def test_check_generation_caps_tokens_at_the_context() -> None:
    """Where the context length is known, max_tokens above it is refused, naming it."""
    check_generation({"max_tokens": 1024}, 1024)
    with pytest.raises(InvalidField) as caught:
        check_generation({"max_tokens": 1025}, 1024)
    assert "1024 (the model's context length)" in str(caught.value)

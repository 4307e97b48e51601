"""The numeric fields of an inference body the runner checks before an engine sees them.

Engines check these too, but each in its own way: llama-server took `max_tokens` 10^12 as
a 32-bit integer and answered "got -727379968"; a value no engine can serve should be
refused in the runner's words, naming the field, before it costs a queue place. Ranges are
OpenAI's; `null` means "not given", as OpenAI reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner.errors import InvalidField

INT32_MAX = 2**31 - 1
"""The largest token count any engine takes (llama-server reads it as a C `int`)."""

_TOKEN_LIMITS = ("max_tokens", "max_completion_tokens")
_INTEGERS: Mapping[str, tuple[int, int]] = {"n": (1, 128), "top_logprobs": (0, 20)}
_NUMBERS: Mapping[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}


def check_generation(body: Mapping[str, Any], context_length: int | None) -> None:
    """Refuse (400 `invalid_request`, `param` naming the field) a generation field out of
    range.

    1. `max_tokens` / `max_completion_tokens`: an integer from 1 to 2^31 - 1 and, when
       the model's context length is known, not above it.
    2. `n` (1..128), `top_logprobs` (0..20): integers in range.
    3. `temperature` (0..2), `top_p` (0..1), `presence_penalty` and `frequency_penalty`
       (-2..2): numbers in range.
    """
    for name in _TOKEN_LIMITS:  # 1
        value = body.get(name)
        if value is None:
            continue
        high = INT32_MAX if context_length is None else min(INT32_MAX, context_length)
        if not _is_int(value) or not 1 <= value <= high:
            rule = "an integer from 1 to " + (
                f"{high} (the model's context length)" if high == context_length else f"{high}"
            )
            raise InvalidField(param=name, rule=rule, value=_shown(value))
    for name, (low, top) in _INTEGERS.items():  # 2
        value = body.get(name)
        if value is not None and (not _is_int(value) or not low <= value <= top):
            raise InvalidField(
                param=name, rule=f"an integer from {low} to {top}", value=_shown(value)
            )
    for name, (lo, hi) in _NUMBERS.items():  # 3
        value = body.get(name)
        if value is not None and (not _is_number(value) or not lo <= value <= hi):
            raise InvalidField(
                param=name, rule=f"a number from {lo:g} to {hi:g}", value=_shown(value)
            )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value: object) -> str:
    """The value as the client sent it, cut short (a field may hold anything)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"

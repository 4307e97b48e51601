"""One canonical request per chat-path endpoint: what reaches the engine is what was
bounded, reserved and charged.

A body may carry OpenAI's fields for its endpoint (`OPENAI_FIELDS`) and the fields its
model's kind declares (`adapters/fields.RequestFields`, in `adapters/<kind>/fields.py`):
those sent as they are (sampling, formats: nothing that changes how much runs), and the
kind's own names for OpenAI's output bound and completion count, which must agree with
OpenAI's. Anything else is refused 400 `unsupported_parameter` naming it, before the
request costs a queue place or a budget reservation.

Every kind serves one completion per request: `n`, `best_of` and a kind's own count
(llama-server's `n_cmpl`) above 1, and a `/v1/completions` `prompt` holding several
prompts, are refused 400 `unsupported_parameter` (each completion would run on an engine
slot the scheduler did not grant, charged from a `usage` that counts one). So a request's
bound is its prompt plus one output bound (runner/tenancy/guard.py), and the output bound
is the one value every output field the body carries agrees on (docs/api.md, "Accepted
fields").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.fields import CHAT, COMPLETIONS, EMBEDDINGS, RequestFields
from runner.errors import InvalidField, UnsupportedParameter
from runner.http.body_checks import INT32_MAX

_COMMON = frozenset(
    [
        "model",
        "stream",
        "stream_options",
        "max_tokens",
        "n",
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "stop",
        "seed",
        "logit_bias",
        "logprobs",
        "user",
    ]
)
OPENAI_FIELDS: Mapping[str, frozenset[str]] = {
    CHAT: _COMMON
    | frozenset(
        [
            "messages",
            "max_completion_tokens",
            "top_logprobs",
            "response_format",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "reasoning_effort",
            "functions",
            "function_call",
            "metadata",
            "store",
            "service_tier",
            "prediction",
        ]
    ),
    COMPLETIONS: _COMMON | frozenset(["prompt", "best_of", "echo", "suffix"]),
    EMBEDDINGS: frozenset(["model", "input", "encoding_format", "dimensions", "user"]),
}
"""OpenAI's request fields per endpoint that every kind serves (OpenAI's API reference;
left out: chat's `audio`, `modalities` and `web_search_options`, which no kind here
serves)."""

OUTPUT_LIMITS = ("max_completion_tokens", "max_tokens")
"""OpenAI's names for the output bound (body_checks.py checks their range)."""
CHOICES = ("n", "best_of")
"""OpenAI's names for completions per prompt (`best_of`: completions only)."""


def canonical(obj: dict[str, Any], path: str, fields: RequestFields, context: int | None) -> bool:
    """Hold `obj` (a parsed body for `path`) to its canonical request, in place; True when
    it changed. Raises 400 `unsupported_parameter` (`param` naming the field) or
    `invalid_request` for a bound that disagrees.

    1. Every field is OpenAI's for `path` or the kind's (`fields`: passed, its output
       limits, its choices); else refused, naming the first such field.
    2. Embeddings: `input` is one of OpenAI's four shapes (`embedding_inputs`), else
       refused; then done (no output, one answer per input).
    3. A completions `prompt` holding more than one prompt (a list of strings or of
       token lists) is refused.
    4. `n`, `best_of` and the kind's choices: absent, null or 1; else refused.
    5. The kind's output limits (llama-server's `n_predict`): an integer, -1 (no bound)
       or 1 to 2^31 - 1 (the context length when known); every output limit given,
       OpenAI's and the kind's, equal, else 400 `invalid_request` naming the kind's; a
       kind's -1 given alone is removed (the engine's default: no bound, which the
       runner bounds by the context or sends `max_tokens` for).
    """
    openai, passed = OPENAI_FIELDS.get(path, frozenset()), fields.passed(path)
    for name in obj:  # 1
        if name not in openai and name not in passed and not _own(name, fields):
            raise UnsupportedParameter(param=name, reason=_not_accepted(path))
    if path == EMBEDDINGS:  # 2
        embedding_inputs(obj.get("input"))
        return False
    if path == COMPLETIONS and prompts_in(obj.get("prompt")) > 1:  # 3
        raise UnsupportedParameter(param="prompt", reason=_ONE_PROMPT)
    for name in CHOICES + fields.choices:  # 4
        value = obj.get(name)
        if value is not None and (value != 1 or isinstance(value, bool)):
            raise UnsupportedParameter(param=name, reason=_ONE_COMPLETION)
    return _one_output_bound(obj, fields.output_limits, context)  # 5


def prompts_in(prompt: object) -> int:
    """How many prompts a completions `prompt` holds: a string or one token list is one;
    a list of strings or of token lists, one per element (as llama-server and vLLM
    split it; OpenAI's own reading)."""
    if isinstance(prompt, list) and prompt and not all(_is_int(t) for t in prompt):
        return len(prompt)
    return 1


def embedding_inputs(value: object) -> list[str] | list[list[int]]:
    """The inputs of an embeddings `input` in OpenAI's shapes only: a string (one), a list
    of strings (one each), a list of token ids (one), a list of token-id lists (one each);
    1 to `MAX_EMBEDDING_INPUTS` of them. Anything else (llama-server's multimodal objects,
    a list mixing text and ids, which it reads as one prompt) is refused 400
    `invalid_request` naming `input`: the runner bounds each input by its own length."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            inputs: list[str] | list[list[int]] = value
        elif all(_is_int(v) for v in value):
            inputs = [value]
        elif all(isinstance(v, list) and v and all(_is_int(t) for t in v) for v in value):
            inputs = value
        else:
            inputs = []
        if 0 < len(inputs) <= MAX_EMBEDDING_INPUTS:
            return inputs
    raise InvalidField(param="input", rule=_INPUT_SHAPES, value=_shape(value))


def _shape(value: object) -> str:
    """What a refused `input` is, in words (never the client's data echoed back)."""
    if isinstance(value, list):
        kinds = sorted({type(v).__name__ for v in value})
        return f"a list of {len(value)} ({', '.join(kinds) or 'nothing'})"
    return f"a {type(value).__name__}"


def _one_output_bound(obj: dict[str, Any], own: tuple[str, ...], context: int | None) -> bool:
    """Step 5 of `canonical`."""
    given = [(n, obj[n]) for n in OUTPUT_LIMITS if obj.get(n) is not None]
    high = INT32_MAX if context is None else min(INT32_MAX, context)
    changed = False
    for name in own:
        value = obj.get(name)
        if value is None:
            continue
        if not _is_int(value) or not (value == -1 or 1 <= value <= high):
            raise InvalidField(param=name, rule=f"-1 or an integer from 1 to {high}", value=value)
        if given and value != given[0][1]:
            first, bound = given[0]
            rule = f"{first}'s value ({bound}) when both are given: both bound the output"
            raise InvalidField(param=name, rule=rule, value=value)
        if value == -1:
            del obj[name]
            changed = True
        else:
            given.append((name, value))
    for name, value in given[1:]:
        first, bound = given[0]
        if value != bound:
            rule = f"{first}'s value ({bound}) when both are given: both bound the output"
            raise InvalidField(param=name, rule=rule, value=value)
    return changed


def _own(name: str, fields: RequestFields) -> bool:
    """`name` is the kind's own name of an OpenAI field (an output limit, a count)."""
    return name in fields.output_limits or name in fields.choices


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _not_accepted(path: str) -> str:
    return (
        f"is not a field of {path} that this model's engine accepts: OpenAI's fields and "
        "the engine kind's own listed in docs/api.md"
    )


MAX_EMBEDDING_INPUTS = 2048
"""OpenAI's limit of inputs per embeddings request (each runs as its own engine task)."""
_INPUT_SHAPES = (
    f"a string, a list of strings, a list of token ids or a list of token-id lists "
    f"(1 to {MAX_EMBEDDING_INPUTS} inputs, none empty)"
)
_ONE_PROMPT = (
    "holds several prompts: send one request per prompt (each runs as its own completion; "
    "the runner bounds and charges one)"
)
_ONE_COMPLETION = (
    "> 1 is not served: send one request per completion (each would run on an engine "
    "slot of its own, outside the request's bound and charge)"
)

"""Token budgets on the data path: what a request may cost, reserved before it queues,
settled when it ends (tenants/budgets.py is the accounting).

The bounds (never below what the engine will report):

- embeddings' prompt: per input (`embedding_bound`), its UTF-8 bytes (a token list: its
  length) plus `EMBEDDING_TOKENS_PER_INPUT` (the special tokens an engine adds to each
  input: BOS/CLS, EOS/SEP, a leading-space piece); the engine's `usage` sums its inputs;
- prompt: the request body's UTF-8 bytes (a token of any byte-level or byte-fallback
  tokenizer covers at least one byte of text, and the body holds every byte of the
  messages) plus the chat template's allowance: `TEMPLATE_TOKENS_PER_MESSAGE` per message
  and `TEMPLATE_TOKENS` per request (role markers, BOS, the generation prompt);
- output: the canonical request's one output limit (`max_completion_tokens`,
  `max_tokens` or the kind's own name, llama-server's `n_predict`: equal when several are
  given, runner/http/canonical.py); without one, the model's context length
  (llama-server's and vLLM's documented default: generate until the context is full);
  where the runner knows no context, `FALLBACK_OUTPUT_TOKENS`, and the request is sent
  with `max_tokens` set to it (no other output field is left to outrank it), so the
  bound holds. Embeddings: 0. One completion: the canonical request refuses `n`,
  `best_of` and an engine's own count above 1 and several prompts in one, so the choices
  factor (`n`, kept as a guard) is 1.

What a request is charged when it ends (`Spent.used`, the same figure for its budgets
and for usage): the engine's own figures when it reported them; for a stream cut short
(client gone, engine failed) the prompt as the engine's first chunk gave it (else its
bound) and the content chunks received plus `CUT_ALLOWANCE_TOKENS`; for a request sent
without an answer, its bounds; for one never sent (or refused by the engine), nothing.

Headers: `x-ratelimit-limit-tokens`, `-remaining-tokens`, `-reset-tokens` (OpenAI's
names; reset as a duration like `1m30s`) of the tightest budget that applies, after
this request's reservation; the request rate's trio (`-requests`) beside `RateLimit-*`.

Reserving and settling: `runner/tenancy/token_budgets.Budgets`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from tenants.ratelimit import RateDecision

TEMPLATE_TOKENS_PER_MESSAGE = 16
TEMPLATE_TOKENS = 64
FALLBACK_OUTPUT_TOKENS = 4096
EMBEDDING_TOKENS_PER_INPUT = 8
CUT_ALLOWANCE_TOKENS = 8
"""Tokens a stream cut short may have been generated beyond the chunks the runner read
before the engine saw the cut (llama-server, seen: 2 past the client's last chunk)."""
Headers = list[tuple[bytes, bytes]]

ROLE_CHUNK = b'"delta":{"role":"assistant","content":""}'
"""A chat stream's first delta, serialized compactly (vLLM's pydantic, OpenAI): no token."""


def duration(seconds: float) -> str:
    """OpenAI's form of a reset: `0s`, `45s`, `1m30s`, `2h0m5s`."""
    s = max(0, math.ceil(seconds))
    hours, rest = divmod(s, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


@functools.lru_cache(maxsize=4096)
def reset_text(seconds: int) -> bytes:
    """`duration` of a whole number of seconds, as a header value (the same few come
    again and again: the seconds left in the windows in force)."""
    return duration(seconds).encode()


def request_headers(decision: RateDecision | None) -> Headers:
    """OpenAI's `x-ratelimit-*-requests` of the request rate (none when unlimited)."""
    if decision is None:
        return []
    return [
        (b"x-ratelimit-limit-requests", b"%d" % decision.rate.amount),
        (b"x-ratelimit-remaining-requests", b"%d" % decision.remaining),
        (b"x-ratelimit-reset-requests", reset_text(math.ceil(decision.reset_after_s))),
    ]


def prompt_bound(body: bytes, obj: dict[str, Any]) -> int:
    messages = obj.get("messages")
    count = len(messages) if isinstance(messages, list) else 1
    return len(body) + TEMPLATE_TOKENS_PER_MESSAGE * count + TEMPLATE_TOKENS


def embedding_bound(value: object) -> int:
    """The most prompt tokens an embeddings `input` (in one of OpenAI's shapes, as
    `runner/http/canonical.embedding_inputs` holds it) can count, input by input."""
    if isinstance(value, str):
        return len(value.encode()) + EMBEDDING_TOKENS_PER_INPUT
    if not isinstance(value, list) or not value:
        return EMBEDDING_TOKENS_PER_INPUT
    if not isinstance(value[0], str | list):  # one input of token ids
        return len(value) + EMBEDDING_TOKENS_PER_INPUT
    return sum(
        (len(v.encode()) if isinstance(v, str) else len(v)) + EMBEDDING_TOKENS_PER_INPUT
        for v in value
        if isinstance(v, str | list)
    )


def output_bound(
    obj: dict[str, Any], context: int | None, embeddings: bool
) -> tuple[int, int | None]:
    """(the most output tokens, the `max_tokens` to send it with when the request's own
    does not bound it: None when it does)."""
    if embeddings:
        return 0, None
    n = obj.get("n")
    choices = n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1
    for key in ("max_completion_tokens", "max_tokens", "n_predict"):
        value = obj.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return choices * value, None
    if context is not None and context > 0:
        return choices * context, None
    return choices * FALLBACK_OUTPUT_TOKENS, FALLBACK_OUTPUT_TOKENS


@dataclass(slots=True)
class Spent:
    """What one request cost: the engine's figures, or what the runner saw of its work."""

    input_bound: int = 0  # the most it can cost (`prompt_bound`, `output_bound`)
    output_bound: int = 0
    reached_engine: bool = False  # sent to the engine and not refused by it
    streamed: bool = False  # the engine's answer is a stream
    ended: bool = False  # the stream ran to its end
    reported: bool = False  # the engine's own final figures came (usage, timings)
    prompt: int = 0  # the engine's figures (prompt: also a stream's first chunk's)
    completion: int = 0
    cached: int = 0
    generated: int = 0  # content chunks received from the engine (a stream)

    def saw(self, chunk: bytes) -> None:
        """Count the tokens a stream's `chunk` carries: one per chat delta `content` or
        completion `text`, but none for a chat stream's first chunk (vLLM's and OpenAI's
        role with an empty content: no token was made)."""
        self.generated += chunk.count(b'"content":"') + chunk.count(b'"text":"')
        self.generated -= chunk.count(ROLE_CHUNK)

    def used(self) -> tuple[int, int]:
        """The (input, output) tokens the request is charged, budgets and usage alike.

        1. The engine reported its figures (a whole answer's usage; a stream's final
           usage or timings): those.
        2. A stream without them: the prompt as the engine's first chunk gave it
           (llama-server), else its bound; the content chunks received, plus
           `CUT_ALLOWANCE_TOKENS` (at most the output bound) if it was cut short (client
           gone, engine failed).
        3. Sent to the engine without an answer (a whole answer cut short or failed):
           the bounds (what it did is unknown; never charged less than it may have used).
        4. Never sent, or refused by the engine: nothing.
        """
        if self.reported:  # 1
            return self.prompt, self.completion
        if not self.reached_engine:  # 4
            return 0, 0
        if self.streamed:  # 2
            made = self.generated
            if not self.ended:
                made = max(made, min(made + CUT_ALLOWANCE_TOKENS, self.output_bound))
            return self.prompt or self.input_bound, made
        return self.input_bound, self.output_bound  # 3

"""Counting a request's prompt tokens as its engine will: a kind's facet, asked only when
the runner's byte bound of the prompt would make a request wait or be refused.

The runner bounds a prompt without a tokenizer (runner/tenancy/guard.py `prompt_bound`:
the body's bytes plus the chat template's allowance), which is always enough and often
ten times too much. A kind whose engines can count a request's prompt exactly, the chat
template applied as the engine applies it, hands a `PromptCounter` in its `Launched`
(`tokens`); a kind without one (an OpenAI-compatible engine attached by URL: OpenAI's API
has no tokenizer endpoint) keeps the byte bound. The token budgets ask it once per
request, and only when the bound does not fit (runner/tenancy/token_budgets.py): a
request that fits at once never pays for it.

`countable(path, obj)` is what every counter shares: the requests whose prompt is text
(a chat whose messages' contents are strings or text parts, a completion's one prompt)
and nothing an engine counts apart from the template (images, audio).
"""

from __future__ import annotations

from typing import Any, Protocol

from adapters.fields import CHAT, COMPLETIONS

COUNT_TIMEOUT_S = 2.0
"""The most a count may take; slower, the byte bound stands (the request was going to
wait or be refused with it anyway)."""


class PromptCounter(Protocol):
    """A kind's prompt counter (the module docstring)."""

    async def count_prompt(self, path: str, obj: dict[str, Any]) -> int | None:
        """The prompt tokens the engine will count for `obj` (the canonical request, as
        it goes to the engine) on `path`; None when it cannot tell (not `countable`, the
        engine did not answer, or answered what the counter does not read)."""
        ...


def countable(path: str, obj: dict[str, Any]) -> bool:
    """Whether a request's prompt is text alone: a chat whose every message's content is
    a string, null or a list of `text` parts; a completion whose `prompt` is a string."""
    if path == COMPLETIONS:
        return isinstance(obj.get("prompt"), str)
    if path != CHAT:
        return False
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        return False
    for message in messages:
        if not isinstance(message, dict):
            return False
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            return False
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            return False
    return True

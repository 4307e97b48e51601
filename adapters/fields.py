"""The body fields a kind's engines take beyond OpenAI's own, on each chat-path endpoint,
and what each does to how much a request runs.

A kind declares one `RequestFields` (`Traits.request_fields`, from its own
`adapters/<kind>/fields.py`); the runner holds every request to its endpoint's canonical
form with it (`runner/http/canonical.py`): OpenAI's fields for the endpoint, plus the
kind's `passed` fields, plus its own names for what OpenAI's fields already say
(`output_limits`, `choices`), which must agree with them. Anything else is refused
400 `unsupported_parameter` naming the field.

`passed` holds only fields that change which tokens are chosen or how the answer is shown,
never how many tokens run or how many completions: those are bounded and charged from
OpenAI's fields, so an engine's alias of them is either checked against them or refused.
"""

from __future__ import annotations

from dataclasses import dataclass

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"


@dataclass(frozen=True, slots=True)
class RequestFields:
    """A kind's own request fields (the module docstring).

    `chat`, `completions`, `embeddings`: the fields sent as they are on that endpoint.
    `output_limits`: the kind's own names for the output bound, read by its engines before
    OpenAI's `max_completion_tokens`/`max_tokens` (llama-server's `n_predict`); -1 there
    means "no bound". `choices`: its own names for completions per prompt (llama-server's
    `n_cmpl`, vLLM's `best_of` on chat), of which only 1 is served.
    """

    chat: frozenset[str] = frozenset()
    completions: frozenset[str] = frozenset()
    embeddings: frozenset[str] = frozenset()
    output_limits: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()

    def passed(self, path: str) -> frozenset[str]:
        """The fields sent as they are on `path` (none on a path the kind does not serve)."""
        if path == CHAT:
            return self.chat
        if path == COMPLETIONS:
            return self.completions
        if path == EMBEDDINGS:
            return self.embeddings
        return frozenset()


OPENAI_ONLY = RequestFields()
"""A kind that declares nothing: OpenAI's fields only."""

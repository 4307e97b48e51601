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

An operator may let more of an engine's fields through for one model (the models file's
`pass_through`, `with_passed`); the kind still says how each counts: a field it lists in
`uncounted` (its engines read it as more tokens or more completions than the bound,
with no rule to bound or charge them), or its own name of an output limit or a count
(those have their rule already), is refused when the models file is read
(`pass_through_refusal`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

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
    `n_cmpl`, vLLM's `best_of` on chat), of which only 1 is served. `uncounted`: fields
    its engines read as more tokens or completions than the request's bound, which no
    rule bounds: never passed through (`pass_through_refusal`).
    """

    chat: frozenset[str] = frozenset()
    completions: frozenset[str] = frozenset()
    embeddings: frozenset[str] = frozenset()
    output_limits: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    uncounted: frozenset[str] = frozenset()

    def with_passed(self, names: Iterable[str]) -> RequestFields:
        """These fields with `names` sent as they are on every endpoint (a model's
        `pass_through`, each checked by `pass_through_refusal` when the file was read)."""
        more = frozenset(names)
        if not more:
            return self
        return replace(
            self,
            chat=self.chat | more,
            completions=self.completions | more,
            embeddings=self.embeddings | more,
        )

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


def pass_through_refusal(fields: RequestFields, name: str) -> str | None:
    """Why a model of a kind with `fields` may not pass `name` through (None: it may).

    1. The kind's own name of an output limit or a count (llama-server's `n_predict`,
       `n_cmpl`): accepted already, held to OpenAI's bound and to one completion.
    2. A field the kind lists as `uncounted`: its engines would run more than the bound
       reserved and charged, and no rule bounds it.
    """
    if name in fields.output_limits or name in fields.choices:  # 1
        return (
            "is the engine kind's own name of an output limit or a completion count: "
            "accepted already, held to OpenAI's max_tokens and n"
        )
    if name in fields.uncounted:  # 2
        return (
            "changes how many tokens or completions the engine runs and the kind has no "
            "rule to bound or charge it"
        )
    return None

"""The canonical request per chat-path endpoint (`runner/http/canonical.py`) with each
kind's declared fields (`adapters/<kind>/fields.py`): what is refused, what passes, and
that the output an engine obeys is never above the bound the runner reserves."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.fields import CHAT, COMPLETIONS, EMBEDDINGS, OPENAI_ONLY, RequestFields
from adapters.llama_server.fields import LLAMA_SERVER_FIELDS
from adapters.openai.kind import ATTACHED_FIELDS
from adapters.vllm.fields import VLLM_FIELDS
from faults import QuorumError
from runner.http.canonical import canonical, prompts_in
from runner.tenancy.guard import output_bound

pytestmark = pytest.mark.timeout(30)

MESSAGES = [{"role": "user", "content": "hi"}]
KINDS = {"llama": LLAMA_SERVER_FIELDS, "vllm": VLLM_FIELDS, "openai": ATTACHED_FIELDS}


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MESSAGES, **extra}


def _refusal(obj: dict[str, Any], path: str, fields: RequestFields) -> tuple[str, str]:
    with pytest.raises(QuorumError) as refused:
        canonical(obj, path, fields, 4096)
    return refused.value.code, str(refused.value.extra["param"])


@pytest.mark.parametrize(
    ("kind", "field", "value", "ok"),
    [
        ("llama", "top_k", 40, True),
        ("llama", "n_probs", 3, True),
        ("llama", "n_keep", -1, False),
        ("llama", "guided_json", {}, False),
        ("vllm", "guided_json", {}, True),
        ("vllm", "min_tokens", 2, True),
        ("vllm", "use_beam_search", True, False),
        ("vllm", "logits_processors", ["x.y"], False),
        ("vllm", "n_predict", 5, False),
        ("openai", "top_k", 40, False),
        ("openai", "cache_prompt", True, True),
    ],
)
def test_canonical_chat_fields_are_openais_or_the_kinds(
    kind: str, field: str, value: object, ok: bool
) -> None:
    """A chat field passes when OpenAI's or declared by the model's kind; any other is
    400 unsupported_parameter naming it."""
    body = _chat(**{field: value})
    if ok:
        canonical(body, CHAT, KINDS[kind], 4096)
        assert body[field] == value
    else:
        assert _refusal(body, CHAT, KINDS[kind]) == ("unsupported_parameter", field)


def test_canonical_embeddings_take_their_own_fields_only() -> None:
    """Embeddings take OpenAI's fields (input lists included) and the kind's own; a
    generation field is refused there."""
    body = {"model": "m", "input": ["a", "b"], "dimensions": 8, "embd_normalize": 2}
    assert canonical(body, EMBEDDINGS, LLAMA_SERVER_FIELDS, None) is False
    assert _refusal({"model": "m", "input": "a", "max_tokens": 3}, EMBEDDINGS, OPENAI_ONLY) == (
        "unsupported_parameter",
        "max_tokens",
    )


@pytest.mark.parametrize(
    ("kind", "field"),
    [("llama", "n"), ("llama", "n_cmpl"), ("vllm", "n"), ("vllm", "best_of"), ("openai", "n")],
)
def test_canonical_one_completion_per_request(kind: str, field: str) -> None:
    """`n`, `best_of` and a kind's own count above 1 are refused naming the field (the
    message says `<field> > 1`); 1 and null pass."""
    assert _refusal(_chat(**{field: 2}), CHAT, KINDS[kind]) == ("unsupported_parameter", field)
    with pytest.raises(QuorumError, match=f"^{field} > 1 is not served"):
        canonical(_chat(**{field: 2}), CHAT, KINDS[kind], 4096)
    for value in (1, None):
        canonical(_chat(**{field: value}), CHAT, KINDS[kind], 4096)


def test_canonical_completions_best_of_is_openais_and_counted() -> None:
    """On /v1/completions `best_of` is OpenAI's own: above 1 refused for every kind."""
    body = {"model": "m", "prompt": "x", "best_of": 3}
    assert _refusal(body, COMPLETIONS, OPENAI_ONLY) == ("unsupported_parameter", "best_of")


@pytest.mark.parametrize(
    ("prompt", "count"),
    [("a", 1), ([1, 2, 3], 1), (["a"], 1), ([[1, 2]], 1), (["a", "b"], 2), ([[1], [2]], 2)],
)
def test_canonical_prompt_lists_count_one_prompt_per_element(prompt: object, count: int) -> None:
    """A string or one token list is one prompt; a list of strings or token lists, one per
    element; more than one is refused naming `prompt`."""
    assert prompts_in(prompt) == count
    body = {"model": "m", "prompt": prompt, "max_tokens": 4}
    if count == 1:
        canonical(body, COMPLETIONS, LLAMA_SERVER_FIELDS, 4096)
    else:
        assert _refusal(body, COMPLETIONS, LLAMA_SERVER_FIELDS) == (
            "unsupported_parameter",
            "prompt",
        )


def test_canonical_output_limits_must_agree() -> None:
    """llama-server's `n_predict` must equal OpenAI's limit when both are given (-1
    included), lie in -1 or 1..context; alone, -1 is removed and a value kept; OpenAI's
    two names must agree too."""
    assert _refusal(_chat(max_tokens=1, n_predict=-1), CHAT, LLAMA_SERVER_FIELDS) == (
        "invalid_request",
        "n_predict",
    )
    assert _refusal(_chat(n_predict=0), CHAT, LLAMA_SERVER_FIELDS)[1] == "n_predict"
    assert _refusal(_chat(n_predict=5000), CHAT, LLAMA_SERVER_FIELDS)[1] == "n_predict"
    assert _refusal(_chat(max_tokens=3, max_completion_tokens=4), CHAT, OPENAI_ONLY) == (
        "invalid_request",
        "max_tokens",
    )
    alone = _chat(n_predict=-1)
    assert canonical(alone, CHAT, LLAMA_SERVER_FIELDS, 4096) is True
    assert "n_predict" not in alone
    agreed = _chat(max_tokens=7, n_predict=7)
    assert canonical(agreed, CHAT, LLAMA_SERVER_FIELDS, 4096) is False
    assert agreed["n_predict"] == 7


def _llama_obeys(obj: dict[str, Any], context: int) -> int:
    """The output llama-server generates at most: its schema reads `n_predict`, then
    `max_completion_tokens`, then `max_tokens`; -1 or none: until the context is full."""
    for name in ("n_predict", "max_completion_tokens", "max_tokens"):
        value = obj.get(name)
        if value is not None:
            return context if value == -1 else int(value)
    return context


def _copies(obj: dict[str, Any]) -> int:
    """Completions llama-server runs: `n_cmpl` (else `n`) per prompt."""
    count = obj.get("n_cmpl", obj.get("n"))
    return (count if isinstance(count, int) and count > 0 else 1) * prompts_in(obj.get("prompt"))


LIMIT = st.one_of(st.none(), st.sampled_from([-1, 0, 1, 7, 40]))
COUNT = st.one_of(st.none(), st.sampled_from([1, 2, 3]))


@given(
    limits=st.fixed_dictionaries(
        {}, optional={"max_tokens": LIMIT, "max_completion_tokens": LIMIT, "n_predict": LIMIT}
    ),
    counts=st.fixed_dictionaries({}, optional={"n": COUNT, "n_cmpl": COUNT}),
    prompt=st.sampled_from(["p", ["p"], ["p", "q"], [1, 2]]),
)
def test_canonical_llama_server_never_runs_more_than_reserved(
    limits: dict[str, Any], counts: dict[str, Any], prompt: object
) -> None:
    """Whatever mix of OpenAI's and llama-server's own limits and counts a body carries,
    once it is canonical llama-server runs no more output than the runner's bound."""
    context = 512
    for path, body in ((CHAT, _chat()), (COMPLETIONS, {"model": "m", "prompt": prompt})):
        obj = {**body, **limits, **counts}
        try:
            canonical(obj, path, LLAMA_SERVER_FIELDS, context)
        except QuorumError as refused:
            assert refused.status == 400
            continue
        bound, cap = output_bound(obj, context, False)
        assert cap is None
        assert _copies(obj) * _llama_obeys(obj, context) <= bound

"""What a request is charged when it ends (`runner/tenancy/guard.Spent.used`), the one
figure its token budgets settle to and its usage records."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.tenancy.guard import CUT_ALLOWANCE_TOKENS, Spent

pytestmark = pytest.mark.timeout(30)


def test_spent_engine_figures_win() -> None:
    """1. Figures the engine reported are the charge, whatever else was seen."""
    spent = Spent(500, 64, reached_engine=True, streamed=True, reported=True, prompt=21,
                  completion=7, generated=9)  # fmt: skip
    assert spent.used() == (21, 7)


def test_spent_stream_cut_short_pays_what_was_made() -> None:
    """2. A stream cut short: the prompt the first chunk gave (else its bound), the chunks
    read plus the allowance, at most the output bound; one that ended: the chunks only."""
    cut = Spent(500, 64, reached_engine=True, streamed=True, prompt=21, generated=5)
    assert cut.used() == (21, 5 + CUT_ALLOWANCE_TOKENS)
    assert Spent(500, 64, reached_engine=True, streamed=True, generated=5).used()[0] == 500
    assert Spent(500, 6, reached_engine=True, streamed=True, generated=5).used() == (500, 6)
    ended = Spent(500, 64, reached_engine=True, streamed=True, ended=True, prompt=21, generated=5)
    assert ended.used() == (21, 5)


def test_spent_counts_the_tokens_a_stream_carries_but_not_the_role_chunk() -> None:
    """A chat delta's content and a completion's text are one token each, an empty one
    too (a token that makes no text yet); a chat stream's first chunk, the role with an
    empty content (vLLM's, OpenAI's), is none: a stream cut after it was charged one
    token it never made (vLLM: 123 charged for 97 made over 3 cuts, above 2% + 8 each)."""
    spent = Spent(500, 64, reached_engine=True, streamed=True)
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
    spent.saw(role + b'"logprobs":null,"finish_reason":null}]}\n\n')
    assert spent.generated == 0
    spent.saw(b'data: {"choices":[{"index":0,"delta":{"content":" a"}}]}\n\n')
    spent.saw(b'data: {"choices":[{"index":0,"delta":{"content":""}}]}\n\n')
    spent.saw(b'data: {"choices":[{"index":0,"text":"b"}]}\n\n')
    spent.saw(b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n')
    assert spent.generated == 3
    assert spent.used() == (500, 3 + CUT_ALLOWANCE_TOKENS)


def test_spent_no_answer_pays_its_bounds_and_none_sent_pays_nothing() -> None:
    """3. Sent without an answer: the bounds. 4. Never sent (or refused): nothing."""
    assert Spent(500, 64, reached_engine=True).used() == (500, 64)
    assert Spent(500, 64).used() == (0, 0)


@given(
    bound_in=st.integers(1, 10_000), bound_out=st.integers(0, 4096),
    generated=st.integers(0, 5000), prompt=st.integers(0, 10_000),
    reached=st.booleans(), ended=st.booleans(),
)  # fmt: skip
def test_spent_a_stream_never_pays_less_than_it_was_seen_to_make(
    bound_in: int, bound_out: int, generated: int, prompt: int, reached: bool, ended: bool
) -> None:
    """A stream that reached the engine pays at least the chunks read and at most the
    larger of its output bound and those chunks; its prompt is the engine's or the bound."""
    spent = Spent(bound_in, bound_out, reached_engine=reached, streamed=True, ended=ended,
                  prompt=prompt, generated=generated)  # fmt: skip
    used_in, used_out = spent.used()
    if not reached:
        assert (used_in, used_out) == (0, 0)
        return
    assert generated <= used_out <= max(bound_out, generated)
    assert used_in == (prompt or bound_in)

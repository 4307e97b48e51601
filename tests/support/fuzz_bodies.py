"""Request bodies drawn from OpenAI's chat/completions fields, the fields each engine kind
declares (adapters/<kind>/fields.py) and the engines' own parameter lists, the ones the
runner refuses included (llama.cpp `tools/server/README.md` and `server-schema.cpp`; vLLM
`vllm/entrypoints/openai/protocol.py` and `SamplingParams`), with values of any JSON type.

`max_tokens` is always present and small (the run must stay short on a CPU), except when a
drawn body names another output field or sets it to a drawn value: the runner's rules
(400 `invalid_request` when they disagree) are part of what is fuzzed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from hypothesis import strategies as st

from adapters.fields import CHAT, COMPLETIONS
from adapters.llama_server.fields import LLAMA_SERVER_FIELDS
from adapters.vllm.fields import VLLM_FIELDS
from runner.http.canonical import OPENAI_FIELDS
from tests.support.poll import eventually

LLAMA_OWN = (
    "n_predict", "n_cmpl", "n_keep", "n_discard", "n_probs", "n_indent", "id_slot",
    "cache_prompt", "samplers", "ignore_eos", "grammar", "json_schema", "mirostat",
    "dry_multiplier", "dry_sequence_breakers", "top_n_sigma", "typical_p", "min_keep",
    "t_max_predict_ms", "timings_per_token", "return_tokens", "post_sampling_probs",
    "response_fields", "chat_format", "grammar_lazy", "grammar_triggers",
    "preserved_tokens", "reasoning_format", "reasoning_budget", "verbose", "lora",
    "sse_ping_interval", "continue_final_message", "slot_id", "n_cache_reuse",
)  # fmt: skip
"""llama-server's own request parameters (its server README), accepted or refused."""
VLLM_OWN = (
    "best_of", "use_beam_search", "top_k", "min_p", "repetition_penalty", "length_penalty",
    "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens",
    "skip_special_tokens", "truncate_prompt_tokens", "prompt_logprobs", "allowed_token_ids",
    "bad_words", "guided_json", "guided_regex", "guided_choice", "structured_outputs",
    "logits_processors", "chat_template", "priority", "request_id", "vllm_xargs",
    "cache_salt", "kv_transfer_params", "echo", "add_generation_prompt",
    "return_token_ids", "mm_processor_kwargs", "prompt_embeds",
)  # fmt: skip
"""vLLM's own request parameters (`protocol.py`, `SamplingParams`), accepted or refused."""

COUNTING = ("n", "best_of", "n_cmpl", "n_predict", "max_completion_tokens", "min_tokens",
            "ignore_eos", "n_probs", "logprobs")  # fmt: skip
"""Fields that change how many tokens run (drawn more often: the attacks of issue 36)."""

_SET_BY_TEST = {"model", "messages", "prompt", "stream", "max_tokens"}

values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 4),
    st.floats(-1.0, 2.0, allow_nan=False),
    st.text("ab \n.", max_size=4),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from(["type", "a"]), st.integers(0, 1), max_size=1),
)
"""Any JSON value, small."""


def field_names(kind: str, chat: bool) -> list[str]:
    """OpenAI's fields for the endpoint, the kind's declared ones and its engine's own."""
    path = CHAT if chat else COMPLETIONS
    declared = (LLAMA_SERVER_FIELDS if kind == "llama-server" else VLLM_FIELDS).passed(path)
    own = LLAMA_OWN if kind == "llama-server" else VLLM_OWN
    names = set(OPENAI_FIELDS[path]) | set(declared) | set(own)
    return sorted(names - _SET_BY_TEST)


@st.composite
def bodies(draw: st.DrawFn, kind: str, model: str) -> tuple[bool, dict[str, Any]]:
    """(chat?, body): a prompt, a small `max_tokens`, maybe a stream, and 0-3 drawn fields."""
    chat = draw(st.booleans())
    body: dict[str, Any] = {"model": model, "max_tokens": draw(st.integers(1, 12))}
    if chat:
        body["messages"] = [{"role": "user", "content": "Name three animals."}]
    else:
        body["prompt"] = draw(st.sampled_from(["Three animals:", ["Animals:", "Trees:"]]))
    if draw(st.booleans()):
        body["stream"] = True
    names = draw(st.lists(st.sampled_from(field_names(kind, chat)), max_size=3, unique=True))
    for name in names:
        body[name] = draw(values)
    if draw(st.booleans()):  # one counting field, with a count (an attack when above 1)
        body[draw(st.sampled_from(COUNTING))] = draw(st.one_of(st.integers(-1, 3), st.booleans()))
    return chat, body


def exchange(
    url: str, headers: dict[str, str], chat: bool, body: dict[str, Any]
) -> tuple[int, int | None, str]:
    """Send `body` (a stream read to its end): its status, its
    `x-ratelimit-remaining-tokens` (None without) and, when refused, its error code."""
    path = CHAT if chat else COMPLETIONS
    with httpx.stream("POST", url + path, json=body, headers=headers, timeout=300) as answer:
        text = answer.read().decode(errors="replace")
    remaining = answer.headers.get("x-ratelimit-remaining-tokens")
    code = ""
    if answer.status_code != 200:
        code = str(json.loads(text).get("error", {}).get("code"))
    return answer.status_code, None if remaining is None else int(remaining), code


@dataclass
class Target:
    """A runner in front of one engine, and that engine's count of generated tokens."""

    url: str
    kind: str  # `llama-server` or `vllm`
    model: str
    generated: Callable[[], int]


def charged(url: str, headers: dict[str, str]) -> tuple[int, int]:
    """(requests, completion tokens) the tenant's usage holds."""
    rows = httpx.get(url + "/v1/usage", headers=headers, timeout=30).json()["data"]
    return sum(r["requests"] for r in rows), sum(r["completionTokens"] for r in rows)


def check_body(
    t: Target, headers: dict[str, str], budget: int, chat: bool, body: dict[str, Any]
) -> None:
    """One fuzzed body: 400, or 200 with generated <= reserved and generated == charged."""
    url = t.url
    requests, spent = charged(url, headers)
    before = t.generated()
    status, remaining, code = exchange(url, headers, chat, body)
    assert status in (200, 400), (status, code, body)
    eventually(lambda: charged(url, headers)[0] > requests, timeout=30)
    generated = t.generated() - before
    if status == 400:
        assert code in ("unsupported_parameter", "invalid_request", "invalid_value"), (code, body)
        return
    assert remaining is not None
    reserved = budget - spent - remaining
    now_charged = charged(url, headers)[1] - spent
    assert generated <= reserved, (generated, reserved, body)
    assert generated <= now_charged <= generated * 1.02, (generated, now_charged, body)

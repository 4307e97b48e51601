"""The request fields vLLM's own, beyond OpenAI's, that the runner sends on
(`adapters/fields.py`), read from vLLM `vllm/entrypoints/openai/protocol.py` (the
`ChatCompletionRequest` / `CompletionRequest` / `EmbeddingCompletionRequest` sampling and
extra parameters); docs/engines.md lists them with the ones refused and why.

- Passed: sampling parameters (`top_k`, `min_p`, `repetition_penalty`, `min_tokens`,
  which vLLM holds to at most the output bound, ...), guided decoding, prompt and
  template options, what the answer shows, and the fields the engine's `rewrite`
  removes or sets itself (`cache_salt`, `kv_transfer_params`, `lora`).
- Own names of OpenAI's fields: `best_of` on chat (OpenAI has it on completions only),
  served at 1 only, like `n`.
- Refused (not listed): `use_beam_search` (one sequence per beam; `uncounted`: never
  passed through either, the models file's `pass_through`), `logits_processors`
  (code named by the client), `chat_template` (a template the client writes),
  `mm_processor_kwargs`, `guided_decoding_backend`, `priority` and `request_id` (the
  runner's own), `vllm_xargs`, `prompt_embeds`.
"""

from __future__ import annotations

from adapters.fields import RequestFields

_SAMPLING = frozenset(
    [
        "top_k",
        "min_p",
        "repetition_penalty",
        "length_penalty",
        "stop_token_ids",
        "include_stop_str_in_output",
        "ignore_eos",
        "min_tokens",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "truncate_prompt_tokens",
        "prompt_logprobs",
        "allowed_token_ids",
        "bad_words",
    ]
)
_GUIDED = frozenset(
    [
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "structural_tag",
        "guided_whitespace_pattern",
        "structured_outputs",
    ]
)
_SHOWN = frozenset(["return_tokens_as_token_ids", "return_token_ids", "add_special_tokens"])
_RUNNER_SETS = frozenset({"cache_salt", "kv_transfer_params", "lora"})
_GENERATION = _SAMPLING | _GUIDED | _SHOWN | _RUNNER_SETS

VLLM_FIELDS = RequestFields(
    chat=_GENERATION
    | frozenset(
        [
            "echo",
            "add_generation_prompt",
            "continue_final_message",
            "documents",
            "chat_template_kwargs",
        ]
    ),
    completions=_GENERATION | {"response_format"},
    embeddings=frozenset({"truncate_prompt_tokens", "add_special_tokens"}),
    choices=("best_of",),
    uncounted=frozenset({"use_beam_search"}),
)

"""The request fields llama-server's own, beyond OpenAI's, that the runner sends on
(`adapters/fields.py`), read from llama.cpp `tools/server/server-schema.cpp`
(`make_llama_cmpl_schema`) and the embeddings handler; docs/engines.md lists them with
the ones refused and why.

- Passed: samplers and their parameters, grammars, what the answer shows (`n_probs`,
  `timings_per_token`, ...), and the cache and adapter fields the engine's `rewrite`
  removes or sets itself (`cache_prompt`, `id_slot`, `lora`, ...). `ignore_eos` runs a
  completion to its output bound, never past it. `t_max_predict_ms` only stops it sooner.
- Own names of OpenAI's fields: `n_predict` (read before `max_completion_tokens` and
  `max_tokens`; -1: no bound) must agree with them; `n_cmpl` (read before `n`) is
  served at 1 only, like `n`.
- Refused (not listed): `n_keep`, `n_discard` (context shift), `chat_format`,
  `chat_parser`, `generation_prompt`, `continue_final_message`, `preserved_tokens`,
  `grammar_triggers`, `grammar_lazy`, `reasoning_*` controls, `backend_sampling`,
  `verbose`, `sse_ping_interval`; `reasoning_format` (a value it does not know, even
  `""`, is its 500, which the runner could only pass on as a 502: found by the fuzz of
  tests/runner/tenancy/test_guard_charge_real.py).
"""

from __future__ import annotations

from adapters.fields import RequestFields

_SAMPLING = frozenset(
    [
        "top_k",
        "min_p",
        "top_n_sigma",
        "typical_p",
        "xtc_probability",
        "xtc_threshold",
        "dynatemp_range",
        "dynatemp_exponent",
        "repeat_last_n",
        "repeat_penalty",
        "dry_multiplier",
        "dry_base",
        "dry_allowed_length",
        "dry_penalty_last_n",
        "dry_sequence_breakers",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
        "min_keep",
        "samplers",
        "ignore_eos",
        "grammar",
        "json_schema",
    ]
)
_SHOWN = frozenset(
    [
        "n_probs",
        "post_sampling_probs",
        "return_tokens",
        "timings_per_token",
        "response_fields",
        "return_progress",
        "n_indent",
        "t_max_predict_ms",
        "parse_tool_calls",
    ]
)
_RUNNER_SETS = frozenset({"cache_prompt", "id_slot", "slot_id", "n_cache_reuse", "lora"})
_GENERATION = _SAMPLING | _SHOWN | _RUNNER_SETS

LLAMA_SERVER_FIELDS = RequestFields(
    chat=_GENERATION | {"chat_template_kwargs"},
    completions=_GENERATION,
    embeddings=frozenset({"embd_normalize"}),
    output_limits=("n_predict",),
    choices=("n_cmpl",),
    uncounted=frozenset({"n_keep", "n_discard"}),
)
"""`uncounted`: `n_keep` and `n_discard` steer context shift, which lets a completion run
past the context the runner bounds an output without `max_tokens` by: never passed
through (the models file's `pass_through`)."""

"""vLLM's count of a request's prompt (`adapters/prompt_tokens.PromptCounter`).

`POST /tokenize` (vLLM `vllm/entrypoints/serve/tokenize/protocol.py`): a chat as
`TokenizeChatRequest` (`model`, `messages` and what its chat endpoint renders the
template with: `add_generation_prompt`, `continue_final_message`, `add_special_tokens`,
`chat_template_kwargs`, `tools`), a completion as `TokenizeCompletionRequest` (`model`,
`prompt`, `add_special_tokens`), each with the defaults of the matching generation
request; it answers `{"count", "max_model_len", "tokens", "token_strs"}`: the tokens its
chat or completions endpoint runs for the same request. A chat with `documents` (rendered
by the template, unknown to `/tokenize`) is not counted. `/tokenize` is not under `/v1`,
so vLLM's API key does not guard it (the runner's own vLLM listens on its private Unix
socket). Checked against the real engine's answers (tests/runner/tenancy/test_prompt_count_vllm.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from adapters.fields import CHAT
from adapters.http_client import ClientFailure, EngineConnections
from adapters.prompt_tokens import COUNT_TIMEOUT_S, countable

log = logging.getLogger("quorum.budgets")

_CHAT_TEMPLATE = (
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template_kwargs",
    "tools",
)
_COMPLETION = ("add_special_tokens",)


class VllmPromptCounter:
    """Counts prompts on one vLLM (its connections)."""

    def __init__(self, http: EngineConnections, timeout_s: float = COUNT_TIMEOUT_S) -> None:
        self.http = http
        self.timeout_s = timeout_s

    async def count_prompt(self, path: str, obj: dict[str, Any]) -> int | None:
        if not countable(path, obj) or "documents" in obj:
            return None
        chat = path == CHAT
        body = {"model": obj.get("model")}
        body["messages" if chat else "prompt"] = obj["messages" if chat else "prompt"]
        body.update((k, obj[k]) for k in (_CHAT_TEMPLATE if chat else _COMPLETION) if k in obj)
        try:
            async with asyncio.timeout(self.timeout_s):
                async with await self.http.post("/tokenize", orjson.dumps(body)) as response:
                    raw = await response.read()
        except (TimeoutError, ClientFailure) as exc:
            log.debug("vLLM did not count a prompt: %r", exc)
            return None
        if response.status != 200:
            return None
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        count = answer.get("count") if isinstance(answer, dict) else None
        return count if isinstance(count, int) and not isinstance(count, bool) else None

"""llama-server's count of a request's prompt (`adapters/prompt_tokens.PromptCounter`).

A chat: `POST /apply-template` with the request as it goes to the engine (llama-server
parses it as its chat endpoint does: messages, tools, `chat_template_kwargs`, the
generation prompt) answers `{"prompt": <the templated text>}`; then `POST /tokenize`
`{"content": <it>, "add_special": true, "parse_special": true}` answers `{"tokens":
[...]}`: the tokens its chat endpoint runs (it tokenizes the templated prompt the same
way: BOS where the model adds one, special tokens parsed). A completion: `/tokenize` of
its `prompt` the same way. Checked against the usage of the real engine's answers
(tests/runner/tenancy/test_prompt_count.py). Both endpoints answer on llama-server's HTTP
threads, not in a slot: a count never waits for a running request.
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


class LlamaPromptCounter:
    """Counts prompts on one llama-server (its connections, its API key)."""

    def __init__(self, http: EngineConnections, timeout_s: float = COUNT_TIMEOUT_S) -> None:
        self.http = http
        self.timeout_s = timeout_s

    async def count_prompt(self, path: str, obj: dict[str, Any]) -> int | None:
        if not countable(path, obj):
            return None
        try:
            async with asyncio.timeout(self.timeout_s):
                if path == CHAT:
                    templated = await self._post("/apply-template", obj)
                    text = templated.get("prompt") if templated is not None else None
                else:
                    text = obj["prompt"]
                if not isinstance(text, str):
                    return None
                body = {"content": text, "add_special": True, "parse_special": True}
                answer = await self._post("/tokenize", body)
        except (TimeoutError, ClientFailure) as exc:
            log.debug("llama-server did not count a prompt: %r", exc)
            return None
        tokens = answer.get("tokens") if answer is not None else None
        return len(tokens) if isinstance(tokens, list) else None

    async def _post(self, path: str, obj: dict[str, Any]) -> dict[str, Any] | None:
        """The engine's JSON object answer, None unless 200 with an object."""
        async with await self.http.post(path, orjson.dumps(obj)) as response:
            body = await response.read()
        if response.status != 200:
            return None
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        return answer if isinstance(answer, dict) else None

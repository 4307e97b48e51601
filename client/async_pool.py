"""`AsyncRunnerPool`: `RunnerPool` (client/pool.py) over `httpx.AsyncClient`, with the
same methods to await; the runners' capabilities are polled concurrently.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import httpx

from client.inference import Answer
from client.lifecycle import LoadResult, ProgressCallback, load_flow
from client.pick import Choice
from client.pool import (
    DEFAULT_DEADLINE_S,
    POLL_TIMEOUT_S,
    PoolBase,
    chat_request,
    completions_request,
    embeddings_request,
    lower_headers,
    transcriptions_request,
)
from client.runner import DEFAULT_TIMEOUT_S
from client.state import RunnerState
from client.steps import NoReply, Reply
from client.tokens import OpToken
from client.transport import drive_async


class AsyncRunnerPool(PoolBase):
    """The same pool over `httpx.AsyncClient`; runners are polled concurrently."""

    def __init__(
        self,
        urls: Iterable[str],
        *,
        tenant: str | None = None,
        api_key: str | None = None,
        priority: str = "normal",
        deadline_s: float = DEFAULT_DEADLINE_S,
        poll_timeout_s: float = POLL_TIMEOUT_S,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        epoch: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            urls,
            tenant=tenant,
            api_key=api_key,
            priority=priority,
            deadline_s=deadline_s,
            clock=clock,
            epoch=epoch,
        )
        self.poll_timeout_s = poll_timeout_s
        self._own = client is None
        self.client = client or httpx.AsyncClient(timeout=timeout_s)

    async def __aenter__(self) -> AsyncRunnerPool:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own:
            await self.client.aclose()

    async def refresh(self, force: bool = False) -> list[RunnerState]:
        """Poll the runners whose cache expired (every runner with `force`), concurrently."""
        calls = self.due(force)

        async def one(url: str, headers: Mapping[str, str]) -> Reply | NoReply:
            try:
                response = await self.client.get(url, headers=headers, timeout=self.poll_timeout_s)
            except httpx.TransportError as exc:
                return NoReply(url, f"{type(exc).__name__}: {exc}", sent=False)
            return Reply(
                url, response.status_code, lower_headers(response.headers), response.content
            )

        outcomes = await asyncio.gather(*(one(c.url, c.headers) for c in calls))
        for call, outcome in zip(calls, outcomes, strict=True):
            self.record(call.url, outcome)
        return self.states()

    async def pick(self, model: str, priority: str | None = None) -> Choice:
        await self.refresh()
        return self.choose_or_raise(model, priority or self.priority)

    async def _run(self, flow: Any) -> Any:
        return await drive_async(flow, self.client, refresh=self.refresh)

    async def load(
        self,
        token: OpToken,
        *,
        model: str | None = None,
        url: str | None = None,
        progress: ProgressCallback | None = None,
        interval_s: float = 1.0,
        timeout_s: float | None = None,
    ) -> LoadResult:
        await self.refresh()
        flow = load_flow(
            self._target(token, url),
            token,
            model=model,
            progress=progress,
            interval_s=interval_s,
            timeout_s=timeout_s,
            clock=self.clock,
            epoch=self.epoch,
        )
        result: LoadResult = await self._run(flow)
        return result

    async def chat(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        priority: str | None = None,
        tenant: str | None = None,
        deadline_s: float | None = None,
        cache_mode: str | None = None,
        cache_tag: str | None = None,
        **fields: Any,
    ) -> Answer:
        request = chat_request(model, messages, fields)
        flow = self._send(
            model, request, priority, tenant or self.tenant, deadline_s, cache_mode, cache_tag
        )
        answer: Answer = await self._run(flow)
        return answer

    async def completions(
        self,
        model: str,
        prompt: str | list[str],
        *,
        priority: str | None = None,
        tenant: str | None = None,
        deadline_s: float | None = None,
        **fields: Any,
    ) -> Answer:
        flow = self._send(
            model,
            completions_request(model, prompt, fields),
            priority,
            tenant or self.tenant,
            deadline_s,
        )
        answer: Answer = await self._run(flow)
        return answer

    async def embeddings(
        self,
        model: str,
        text: str | list[str],
        *,
        priority: str | None = None,
        tenant: str | None = None,
        deadline_s: float | None = None,
        **fields: Any,
    ) -> Answer:
        flow = self._send(
            model,
            embeddings_request(model, text, fields),
            priority,
            tenant or self.tenant,
            deadline_s,
        )
        answer: Answer = await self._run(flow)
        return answer

    async def transcriptions(
        self,
        model: str,
        audio: bytes,
        *,
        filename: str = "audio.wav",
        priority: str | None = None,
        tenant: str | None = None,
        deadline_s: float | None = None,
        **fields: str,
    ) -> Answer:
        request = transcriptions_request(model, audio, filename, fields)
        flow = self._send(model, request, priority, tenant or self.tenant, deadline_s)
        answer: Answer = await self._run(flow)
        return answer

    async def openai_client(self, model: str, *, priority: str | None = None, **kwargs: Any) -> Any:
        """An `openai.AsyncOpenAI` client pointed at the runner `pick(model)` chooses now."""
        import openai

        choice = await self.pick(model, priority)
        return openai.AsyncOpenAI(**{**self._openai_kwargs(choice, priority), **kwargs})

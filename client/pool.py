"""Several runners as one: poll their capabilities, pick one per request, fall over.

    with RunnerPool(["http://gpu-a:8080", "http://gpu-b:8080"], tenant="acme") as pool:
        choice = pool.pick("gemma-3-270m")          # choice.url, choice.reason
        answer = pool.chat("gemma-3-270m", [{"role": "user", "content": "Hi"}])
        answer.json()["choices"][0], answer.headers["x-queue-wait-ms"], answer.url

`RunnerPool` blocks (httpx.Client); `AsyncRunnerPool` (client/async_pool.py) has the same
methods to await (httpx.AsyncClient). Capabilities are polled lazily, before a choice, and
never more often than each runner's cache allows (Cache-Control max-age, 5 s): call
`refresh(force=True)` to poll now regardless of age, or `states()` to read what is known
(with `age(now)`). A pool's states are not locked: share one pool per thread, or use the
async pool from one event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import httpx

from client.core import PoolCore
from client.errors import ClientError
from client.inference import Answer, Request, request_headers, send_flow
from client.lifecycle import LoadResult, ProgressCallback, load_flow
from client.pick import Choice
from client.runner import DEFAULT_TIMEOUT_S, identity_headers
from client.state import RunnerState
from client.steps import Flow, NoReply, Reply
from client.tokens import OpToken
from client.transport import drive_sync

DEFAULT_DEADLINE_S = 30.0
POLL_TIMEOUT_S = 5.0
"""A runner that takes longer than this (`poll_timeout_s`) to answer capabilities counts as
unreachable: as long as the contract's polling period, so a busy runner is not dropped."""


class PoolBase(PoolCore):
    def __init__(
        self,
        urls: Iterable[str],
        *,
        tenant: str | None,
        api_key: str | None,
        priority: str,
        deadline_s: float,
        clock: Callable[[], float],
        epoch: Callable[[], float],
    ) -> None:
        super().__init__(urls, headers=identity_headers(tenant, api_key), clock=clock, epoch=epoch)
        self.tenant = tenant
        self.api_key = api_key
        self.priority = priority
        self.deadline_s = deadline_s

    def _send(
        self,
        model: str,
        request: Request,
        priority: str | None,
        tenant: str | None,
        deadline_s: float | None,
        cache_mode: str | None = None,
        cache_tag: str | None = None,
    ) -> Flow[Answer]:
        priority = priority or self.priority
        headers = request_headers(tenant, priority, cache_mode, cache_tag)
        request = Request(request.path, request.json, request.files, request.data, headers)
        return send_flow(
            self,
            model,
            request,
            priority=priority,
            deadline_s=self.deadline_s if deadline_s is None else deadline_s,
        )

    def _target(self, token: OpToken, url: str | None) -> str:
        """Where a lifecycle operation goes: `url`, else the runner the token names (aud)."""
        if url is not None:
            return url.rstrip("/")
        if len(self.urls) == 1:
            return self.urls[0]
        found = self.by_runner_id(token.aud) if token.aud else None
        if found is None:
            raise ClientError(
                f"the token is addressed to runner {token.aud!r}, which no runner of this "
                "pool reports as its runnerId; pass url="
            )
        return found

    def _openai_kwargs(self, choice: Choice, priority: str | None) -> dict[str, Any]:
        headers = request_headers(self.tenant, priority or self.priority)
        return {
            "base_url": choice.url + "/v1",
            "api_key": self.api_key or "unused",  # the SDK insists on one
            "default_headers": headers,
        }


def chat_request(
    model: str, messages: Sequence[Mapping[str, Any]], fields: dict[str, Any]
) -> Request:
    return Request("/v1/chat/completions", {"model": model, "messages": list(messages), **fields})


def completions_request(model: str, prompt: str | list[str], fields: dict[str, Any]) -> Request:
    return Request("/v1/completions", {"model": model, "prompt": prompt, **fields})


def embeddings_request(model: str, text: str | list[str], fields: dict[str, Any]) -> Request:
    return Request("/v1/embeddings", {"model": model, "input": text, **fields})


def transcriptions_request(
    model: str, audio: bytes, filename: str, fields: Mapping[str, str]
) -> Request:
    files = {"file": (filename, audio, "application/octet-stream")}
    return Request("/v1/audio/transcriptions", files=files, data={"model": model, **fields})


class RunnerPool(PoolBase):
    """A blocking pool of runners (see the module docstring)."""

    def __init__(
        self,
        urls: Iterable[str],
        *,
        tenant: str | None = None,
        api_key: str | None = None,
        priority: str = "normal",
        deadline_s: float = DEFAULT_DEADLINE_S,
        poll_timeout_s: float = POLL_TIMEOUT_S,
        client: httpx.Client | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        epoch: Callable[[], float] = time.time,
        sleep: Callable[[float], object] = time.sleep,
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
        self.client = client or httpx.Client(timeout=timeout_s)
        self._sleep = sleep

    def __enter__(self) -> RunnerPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._own:
            self.client.close()

    def refresh(self, force: bool = False) -> list[RunnerState]:
        """Poll the runners whose cache expired (every runner with `force`), one by one."""
        for call in self.due(force):
            try:
                response = self.client.get(
                    call.url, headers=call.headers, timeout=self.poll_timeout_s
                )
                outcome: Reply | NoReply = Reply(
                    call.url,
                    response.status_code,
                    lower_headers(response.headers),
                    response.content,
                )
            except httpx.TransportError as exc:
                outcome = NoReply(call.url, f"{type(exc).__name__}: {exc}", sent=False)
            self.record(call.url, outcome)
        return self.states()

    def pick(self, model: str, priority: str | None = None) -> Choice:
        """The best runner for `model` now (NoRunnerAvailable if none); `choice.reason` says why."""
        self.refresh()
        return self.choose_or_raise(model, priority or self.priority)

    def _run(self, flow: Any) -> Any:
        return drive_sync(flow, self.client, refresh=self.refresh, sleep=self._sleep)

    def load(
        self,
        token: OpToken,
        *,
        model: str | None = None,
        url: str | None = None,
        progress: ProgressCallback | None = None,
        interval_s: float = 1.0,
        timeout_s: float | None = None,
    ) -> LoadResult:
        """Load what `token` approves on the runner it is addressed to (or `url`)."""
        self.refresh()
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
        result: LoadResult = self._run(flow)
        return result

    def chat(
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
        """POST /v1/chat/completions (non-streamed; stream with `openai_client`)."""
        request = chat_request(model, messages, fields)
        flow = self._send(
            model, request, priority, tenant or self.tenant, deadline_s, cache_mode, cache_tag
        )
        answer: Answer = self._run(flow)
        return answer

    def completions(
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
        answer: Answer = self._run(flow)
        return answer

    def embeddings(
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
        answer: Answer = self._run(flow)
        return answer

    def transcriptions(
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
        """POST /v1/audio/transcriptions (multipart; `fields` are the form's other fields)."""
        request = transcriptions_request(model, audio, filename, fields)
        flow = self._send(model, request, priority, tenant or self.tenant, deadline_s)
        answer: Answer = self._run(flow)
        return answer

    def openai_client(self, model: str, *, priority: str | None = None, **kwargs: Any) -> Any:
        """An `openai.OpenAI` client pointed at the runner `pick(model)` chooses now, sending
        this pool's tenant and priority headers (needs the `openai` package)."""
        import openai

        choice = self.pick(model, priority)
        return openai.OpenAI(**{**self._openai_kwargs(choice, priority), **kwargs})


def lower_headers(headers: httpx.Headers) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}

"""Inference through a pool: pick a runner, send, and on refusal fall over to the next.

`send_flow` is the one decision path for `chat`, `completions`, `embeddings` and
`transcriptions` (the pool's flows, below); `Request` says what to send. The answer comes
back with the runner's `X-*` headers (`X-Cache-Hit`, `X-Cache-Tokens-Reused`,
`X-Queue-Wait-Ms`, `X-GPU-Time-Ms`, `X-Request-Id`, ...) and every attempt made on the way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from client.core import PoolCore, refresh
from client.errors import (
    Attempt,
    ClientError,
    DeadlineExceeded,
    NoRunnerAvailable,
    RunnerUnreachable,
)
from client.pick import left_out
from client.steps import Call, Flow, NoReply, Reply, Sleep, refusal

FALL_OVER_STATUSES = (429, 503)
STALE_VIEW_CODES = ("model_not_loaded", "model_not_found")
"""A 404 with these codes: the pool's view was stale; another runner may have the model."""
MIN_WAIT_S = 0.05


@dataclass(frozen=True, slots=True)
class Request:
    path: str
    json: object = None
    files: Mapping[str, tuple[str, bytes, str]] | None = None
    data: Mapping[str, str] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Answer:
    url: str
    """The runner that answered."""
    status: int
    headers: Mapping[str, str]
    """The runner's `X-*` headers, names in lower case."""
    content: bytes
    attempts: tuple[Attempt, ...]
    """Every try, this one last."""

    def json(self) -> Any:
        """The body, parsed (JSON, as `httpx.Response.json()`: read it as the endpoint's
        OpenAI-shaped answer)."""
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    @property
    def cache_hit(self) -> bool | None:
        value = self.headers.get("x-cache-hit")
        return None if value is None else value == "true"

    @property
    def queue_wait_ms(self) -> int | None:
        value = self.headers.get("x-queue-wait-ms")
        return int(value) if value is not None and value.isdigit() else None


def request_headers(
    tenant: str | None,
    priority: str | None,
    cache_mode: str | None = None,
    cache_tag: str | None = None,
) -> dict[str, str]:
    """The contract's request headers, only those given."""
    headers = {}
    for name, value in (
        ("X-Tenant-ID", tenant),
        ("X-Priority", priority),
        ("X-Cache-Mode", cache_mode),
        ("X-Cache-Tag", cache_tag),
    ):
        if value is not None:
            headers[name] = value
    return headers


def send_flow(
    core: PoolCore, model: str, request: Request, *, priority: str, deadline_s: float
) -> Flow[Answer]:
    """Send `request` for `model` to the best runner, falling over until one answers.

    1. Refresh the runners whose capabilities cache expired.
    2. Pick the best runner not tried in this round (client/pick.py); send the request.
    3. The answer:
       a. connection failed before sending: the runner is marked unreachable; next (2);
       b. 429 or 503: its Retry-After is remembered (it ranks the runner lower); next (2);
       c. 404 model_not_loaded / model_not_found: the view was stale; next (2);
       d. 2xx: the Answer, with the runner's X-* headers and the attempts;
       e. anything else, or a failure after the request may have reached the runner:
          raised (RunnerRefused, RunnerUnreachable): sending it again could run it twice.
    4. No runner left to try in this round:
       a. nothing was ever tried: NoRunnerAvailable, with why each runner was left out;
       b. some runner asked to retry later, and the earliest such time lies within the
          deadline: wait until then, start a new round (1);
       c. otherwise DeadlineExceeded, carrying the attempts and the last refusal.
    """
    started = core.clock()
    attempts: list[Attempt] = []
    last: ClientError | None = None
    tried: set[str] = set()
    headers = {**core.headers, **request.headers}
    yield from refresh(core)  # 1
    while True:
        choice = core.choose(model, priority, exclude=tried)  # 2
        if choice is None:  # 4
            if not attempts:  # a
                raise NoRunnerAvailable(model, left_out(model, core.states()))
            waits = [s.retry_after_s(core.clock()) for s in core.states() if s.url in tried]
            waits = [w for w in waits if w > 0]
            elapsed = core.clock() - started
            if waits and elapsed + min(waits) <= deadline_s:  # b
                yield Sleep(max(min(waits), MIN_WAIT_S))
                tried.clear()
                yield from refresh(core)
                continue
            raise DeadlineExceeded(model, attempts, last)  # c
        url = choice.url
        tried.add(url)
        outcome = yield Call(
            "POST",
            url + request.path,
            json=request.json,
            headers=headers,
            files=request.files,
            data=request.data,
            timeout_s=max(deadline_s - (core.clock() - started), 1.0),
        )
        if isinstance(outcome, NoReply):  # 3a / 3e
            attempts.append(Attempt(url, None, "unreachable"))
            core.mark_unreachable(url, outcome.reason)
            last = RunnerUnreachable(url, outcome.reason)
            if outcome.sent:
                raise last
            continue
        assert isinstance(outcome, Reply)
        if outcome.ok:  # 3d
            attempts.append(Attempt(url, outcome.status))
            return Answer(
                url, outcome.status, _x_headers(outcome), outcome.content, tuple(attempts)
            )
        error = refusal(outcome, core.epoch())
        attempts.append(Attempt(url, outcome.status, error.code, error.retry_after))
        last = error
        if outcome.status in FALL_OVER_STATUSES:  # 3b
            core.mark_refused(url, error.retry_after)
        elif not (outcome.status == 404 and error.code in STALE_VIEW_CODES):  # 3c
            raise error  # 3e


def _x_headers(reply: Reply) -> dict[str, str]:
    return {k: v for k, v in reply.headers.items() if k.startswith("x-") or k == "retry-after"}


def chat(
    pool: PoolCore,
    /,
    model: str,
    messages: Sequence[Mapping[str, object]],
    *,
    priority: str | None = None,
    tenant: str | None = None,
    deadline_s: float | None = None,
    cache_mode: str | None = None,
    cache_tag: str | None = None,
    **fields: object,
) -> Flow[Answer]:
    """POST /v1/chat/completions (not streamed: stream with `openai_client`); `fields` are
    the body's other fields (`max_tokens=16`, ...)."""
    body = {"model": model, "messages": list(messages), **fields}
    request = Request("/v1/chat/completions", body)
    return _send(pool, model, request, priority, tenant, deadline_s, cache_mode, cache_tag)


def completions(
    pool: PoolCore,
    /,
    model: str,
    prompt: str | list[str],
    *,
    priority: str | None = None,
    tenant: str | None = None,
    deadline_s: float | None = None,
    **fields: object,
) -> Flow[Answer]:
    """POST /v1/completions."""
    request = Request("/v1/completions", {"model": model, "prompt": prompt, **fields})
    return _send(pool, model, request, priority, tenant, deadline_s)


def embeddings(
    pool: PoolCore,
    /,
    model: str,
    text: str | list[str],
    *,
    priority: str | None = None,
    tenant: str | None = None,
    deadline_s: float | None = None,
    **fields: object,
) -> Flow[Answer]:
    """POST /v1/embeddings."""
    request = Request("/v1/embeddings", {"model": model, "input": text, **fields})
    return _send(pool, model, request, priority, tenant, deadline_s)


def transcriptions(
    pool: PoolCore,
    /,
    model: str,
    audio: bytes,
    *,
    filename: str = "audio.wav",
    priority: str | None = None,
    tenant: str | None = None,
    deadline_s: float | None = None,
    **fields: str,
) -> Flow[Answer]:
    """POST /v1/audio/transcriptions (multipart; `fields` are the form's other fields)."""
    files = {"file": (filename, audio, "application/octet-stream")}
    request = Request("/v1/audio/transcriptions", files=files, data={"model": model, **fields})
    return _send(pool, model, request, priority, tenant, deadline_s)


def _send(
    pool: PoolCore,
    model: str,
    request: Request,
    priority: str | None,
    tenant: str | None,
    deadline_s: float | None,
    cache_mode: str | None = None,
    cache_tag: str | None = None,
) -> Flow[Answer]:
    """`send_flow` with the pool's defaults for what the call leaves out."""
    priority = priority or pool.priority
    headers = request_headers(tenant or pool.tenant, priority, cache_mode, cache_tag)
    return send_flow(
        pool,
        model,
        replace(request, headers=headers),
        priority=priority,
        deadline_s=pool.deadline_s if deadline_s is None else deadline_s,
    )

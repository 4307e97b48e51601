"""The chat path: OpenAI-compatible text inference, forwarded to the model's engine.

`POST /v1/chat/completions`, `/v1/completions`, `/v1/embeddings`. This is the hot path,
written as a bare ASGI handler (no framework routing, no request objects): every request
pays for it, so it does only what the features need. Through the one front-end
(runner/http/frontend.py), which calls `ChatPath.serve`; the path asks only the gate it was
handed (runner/http/path_gate.py), never the front-end back:

    1. identify the tenant, rate limit                     (front-end)  -> 400/401/403/429
    2. read the body, bounded                                            -> 413
    3. parse it once; the model: an adapter resolved to its base model when its tenant is
       bound to it (`runner/engines/adapters.bound_adapter`), then `check_model` (the tenant's
       `models` entitlement, on the adapter's id for an adapter); the numeric fields
       the runner can check (`runner/http/body_checks.py`: token limits, sampling ranges);
       drop `x_*` extension fields; the endpoint's canonical request (`canonical.py`: the
       fields OpenAI's and the model's kind's, one completion, one output bound); the
       tenant's token budgets reserve the request's upper bound (runner/tenancy/guard.py)
                                                           -> 400 / 403 / 404 / 429 / 503
    4. let the adapter adjust; re-serialize only if changed
    5. admission (the scheduler's queue), under the disconnect scope     -> 503 + Retry-After
    6. forward; stream chunk by chunk, or read the JSON answer and its cache report;
       a failure talking to the engine is translated once (`_engine_error`); what is
       left of the request's deadline bounds its placement and the engine until the
       answer's first byte (`runner/http/deadline.py`)                     -> 504
    7. answer with the engine's body plus X-Cache-*, X-Queue-Wait-Ms, X-GPU-Time-Ms,
       X-Request-Id, RateLimit-*; an engine's refusal (any status but 200) is answered in
       the runner's envelope (`adapters/refusals.py`), its body as written logged only

A client that disconnects after its body was read cancels the handler: while queued it
is withdrawn, while served the engine connection is dropped (the engine then aborts).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from adapters.base import NO_REPORT, CacheReport, ChatEngine, Placement
from adapters.errors import EngineBadResponse, EngineReplaced
from adapters.fields import OPENAI_ONLY, RequestFields
from adapters.http_client import ClientFailure, Response, translate_failure
from adapters.prompt_tokens import PromptCounter
from adapters.refusals import refusal
from faults import QuorumError
from runner.engines.adapters import (
    AdapterBook,
    AdapterRecord,
    Counted,
    bound_adapter,
    check_adapter,
)
from runner.errors import BadRequest, error_body
from runner.http.admitted import Admitted
from runner.http.asgi import JSON, read_body, send_whole
from runner.http.body_checks import check_generation
from runner.http.call import ClientCall
from runner.http.canonical import canonical
from runner.http.chat_reports import response_headers, sniff_report, took
from runner.http.deadline import first_byte_within
from runner.http.json_body import OFFLOAD_BYTES, dump_json, load_json
from runner.http.path_gate import PathGate
from runner.http.traced import engine_call
from runner.scheduler.grants import Usage
from runner.telemetry import tracing
from runner.telemetry.metrics import Metrics
from runner.tenancy.guard import embedding_bound, output_bound, prompt_bound

log = logging.getLogger("quorum.chat")

CHAT_PATHS: frozenset[str] = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/embeddings"}
)
_SSE = b"text/event-stream"


class ChatPath:
    """`serve` is the path's work on a call the front-end identified (`FrontEnd.path`);
    `gate` what it asks on the way (the model, token budgets, admission); `engines` holds
    the ready engines (the model pool keeps it current); `context_of(model)` its context
    length where known (the body checks read it); `adapters` the runner's LoRA adapters,
    served on their base models' engines; `fields_of(model)` the request fields its kind
    takes beyond OpenAI's (None: OpenAI's only); `counters` the ready engines that count
    prompts (adapters/prompt_tokens.py), asked by the token budgets only for a request
    whose byte bound does not fit."""

    def __init__(
        self,
        gate: PathGate,
        engines: Mapping[str, ChatEngine],
        metrics: Metrics,
        max_body_bytes: int,
        context_of: Callable[[str], int | None] = lambda _model: None,
        adapters: AdapterBook | None = None,
        fields_of: Callable[[str], RequestFields | None] = lambda _model: None,
        counters: Mapping[str, PromptCounter] | None = None,
    ) -> None:
        self.gate = gate
        self.counters: Mapping[str, PromptCounter] = counters if counters is not None else {}
        self.engines = engines
        self.context_of = context_of
        self.metrics = metrics
        self.max_body = max_body_bytes
        self.adapters = adapters if adapters is not None else AdapterBook((), {})
        self.fields_of = fields_of

    async def serve(self, call: ClientCall) -> int:
        body = await read_body(call.receive, call.meta.content_length, self.max_body)  # 2
        if len(body) >= OFFLOAD_BYTES:  # 3: off the event loop (runner/http/json_body.py)
            obj, model = await _parse_large(body)
        else:
            obj, model = _parse(body)
        adapter = self._adapter(call, model)
        if adapter is not None:
            model = adapter.adapter.base
        self.gate.check_model(call, model, "chat", adapter.adapter.id if adapter else None)
        context = self.context_of(model)
        path = call.scope["path"]
        embeddings = path == "/v1/embeddings"
        if not embeddings:
            check_generation(obj, context)
        engine = self.engines.get(model)
        if adapter is not None and engine is not None:
            check_adapter(adapter, self.adapters.loaded(adapter))
        changed = _strip_extensions(obj)
        changed |= canonical(obj, path, self.fields_of(model) or OPENAI_ONLY, context)
        spent = call.spent  # what it can cost at most (runner/tenancy/guard.py)
        if embeddings:  # input by input (canonical held `input` to OpenAI's shapes)
            spent.input_bound = embedding_bound(obj["input"])
        else:
            spent.input_bound = prompt_bound(body, obj)
        spent.output_bound, cap = output_bound(obj, context, embeddings)
        if call.policy.token_budgets:
            counter = None if embeddings else self.counters.get(model)
            recount = functools.partial(counter.count_prompt, path, obj) if counter else None
            await self.gate.reserve_tokens(call, model, recount)
            if cap is not None and call.held is not None:  # the bound must hold
                obj["max_tokens"] = cap
                changed = True
        meta = call.meta
        if engine is not None:  # 4
            changed |= engine.rewrite(obj, meta.cache_mode, call.tenant)
        if changed:
            size = len(body)
            body = orjson.dumps(obj) if size < OFFLOAD_BYTES else await dump_json(obj, size)
        request = call.admission_request(_estimate_input_tokens(body), _estimate_output(obj))
        with Counted(adapter) as count:
            async with self.gate.admitted(call, request) as admitted:  # 5
                count.running()
                engine, body = self._current(call, model, engine, obj, body, adapter)
                try:
                    return await self._place_and_forward(call, admitted, engine, body, obj, adapter)
                except EngineReplaced:  # swapped under it before anything was sent
                    replaced = engine
                    engine, body = self._current(call, model, engine, obj, body, adapter)
                    if engine is replaced:
                        raise
                    return await self._place_and_forward(call, admitted, engine, body, obj, adapter)

    def _current(
        self,
        call: ClientCall,
        model: str,
        engine: ChatEngine | None,
        obj: dict[str, Any],
        body: bytes,
        adapter: AdapterRecord | None,
    ) -> tuple[ChatEngine, bytes]:
        """The engine serving `model` now, and the body for it: another than `engine` when
        the model was (re)started while the request waited or was placed on the old one."""
        current = self.engines.get(model)
        if current is None:  # it stopped or crashed between the grant and now
            raise self.gate.engine_gone(model)
        if current is not engine and current.rewrite(obj, call.meta.cache_mode, call.tenant):
            body = orjson.dumps(obj)
        if adapter is not None:
            check_adapter(adapter, self.adapters.loaded(adapter))
        return current, body

    def _adapter(self, call: ClientCall, model: str) -> AdapterRecord | None:
        """The adapter `model` names, when the tenant is bound to it (else none: an
        unknown model to it)."""
        return bound_adapter(self.adapters, call.tenant, model)

    async def _place_and_forward(
        self,
        call: ClientCall,
        admitted: Admitted,
        engine: ChatEngine,
        body: bytes,
        obj: dict[str, Any],
        adapter: AdapterRecord | None,
    ) -> int:
        """Step 6 on the granted engine, with the adapter the runner chose; usage kept."""
        meta, spent = call.meta, call.spent
        adapter_id = adapter.adapter.id if adapter is not None else None
        async with first_byte_within(meta.deadline_ms, call.queue_wait_ms) as call.first_byte:
            try:
                placement = await engine.place(body, obj, call.tenant, meta.cache_tag, adapter_id)
            except QuorumError:
                if engine.cut is not None:  # stopped under the placement: say why
                    raise engine.cut from None
                raise
            report = NO_REPORT
            try:
                forward = self._forward(call, admitted, engine, placement, obj)  # 6
                run = engine_call(call, engine, forward) if tracing.ON else forward
                status, report = await run
            finally:
                engine.done(placement, report)
                call.engine_ms = report.gpu_time_ms
                if spent.reported:
                    admitted.usage = Usage(spent.prompt, spent.completion)
                    self.metrics.count_tokens(
                        call.tenant, call.model, spent.prompt, spent.completion
                    )
        return status

    async def _forward(
        self,
        call: ClientCall,
        admitted: Admitted,
        engine: ChatEngine,
        placement: Placement,
        obj: dict[str, Any],
    ) -> tuple[int, CacheReport]:
        """Step 6: one exchange with the engine; its failures become one engine error."""
        path = call.scope["path"]
        call.spent.reached_engine = True
        try:
            head = tracing.traceparent() if tracing.ON else b""  # its context, to the engine
            resp = await engine.http.post(path, placement.body, head)
            try:
                if obj.get("stream") is True and resp.status == 200:
                    return await self._stream(call, admitted, engine, placement, resp)
                payload = await resp.read()
            finally:
                resp.release()
        except ClientFailure as exc:
            raise await _engine_error(exc, engine) from None
        return await self._whole(call, admitted, engine, resp, payload)

    async def _whole(
        self,
        call: ClientCall,
        admitted: Admitted,
        engine: ChatEngine,
        resp: Response,
        payload: bytes,
    ) -> tuple[int, CacheReport]:
        """A whole answer with its report; an engine's refusal becomes our envelope."""
        if resp.status != 200:
            log.info("engine for %s answered %d: %r", call.model, resp.status, payload[:2000])
            call.spent.reached_engine = False  # refused: it did no work to pay for
            raise refusal(resp.status, payload, call.model)
        report = NO_REPORT
        try:
            parsed = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise EngineBadResponse(
                f"engine for model {call.model!r} returned a body that is not JSON"
            ) from None
        if isinstance(parsed, dict):
            report = took(call, engine.report(parsed), final=True)
        admitted.disarm()
        call.answering()
        headers = response_headers(call, report, resp.header(b"content-type", JSON))
        await send_whole(call.send, 200, headers, payload)
        if report.cache_hit:
            self.metrics.count_cache(call.model, report.tokens_reused)
        return 200, report

    async def _stream(
        self,
        call: ClientCall,
        admitted: Admitted,
        engine: ChatEngine,
        placement: Placement,
        resp: Response,
    ) -> tuple[int, CacheReport]:
        """Stream the engine's answer chunk by chunk.

        The headers leave with the first chunk; an engine whose first chunk carries the
        cache report (`holds_headers_for_first_chunk`) has it read first, so the headers
        say what the engine reused. The final chunk's usage/timings then correct the
        report the scheduler and metrics get. A failure once the answer has started
        ends it with an SSE error event.
        """
        send, strip, spent = call.send, placement.strip, call.spent
        spent.streamed = True
        chunks = resp.chunks()
        first = b""
        report = NO_REPORT
        if engine.holds_headers_for_first_chunk:
            first = await anext(chunks, b"")
            report = engine.first_chunk_report(first) or NO_REPORT
            spent.prompt = report.input_tokens  # the prompt's length, if it says
        headers = response_headers(call, report, resp.header(b"content-type", _SSE))
        call.answering()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if report.cache_hit:
            self.metrics.count_cache(call.model, report.tokens_reused)
        try:
            if strip is not None:
                first = strip(first)
            if first:
                await send({"type": "http.response.body", "body": first, "more_body": True})
            async for chunk in chunks:
                spent.saw(chunk)  # the tokens it carries, for a stream cut short
                has_usage = b'"usage"' in chunk
                if has_usage or b'"timings"' in chunk:  # read before `strip` may take it out
                    sniffed = sniff_report(engine, chunk)
                    if sniffed is not None:
                        report = took(call, sniffed, final=False)
                if strip is not None and (has_usage or b'"prompt_progress"' in chunk):
                    chunk = strip(chunk)
                    if not chunk.strip():
                        continue
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except ClientFailure as exc:
            error = await _engine_error(exc, engine)
            log.warning("stream from %s broke: %s", call.model, error)
            admitted.disarm()
            event = b"data: " + error_body(error) + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": False})
            return error.status, report
        spent.ended = True
        spent.reported = bool(spent.completion)  # the final chunk's figures came
        admitted.disarm()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return 200, report


async def _engine_error(exc: ClientFailure, engine: ChatEngine) -> QuorumError:
    """The engine client's failure as an engine error; when the runner stopped the engine
    under the request (`engine.cut`), or the engine process died, say so (the supervisor
    may need a moment to see the exit that reset the connection)."""
    if engine.cut is not None:
        return engine.cut
    failure = engine.failure or await engine.diagnose()
    return translate_failure(exc, engine.model_id, failure)


def _loads(body: bytes) -> object:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadRequest("request body must be a JSON object") from None


def _parse(body: bytes) -> tuple[dict[str, Any], str]:
    return _checked(_loads(body))


async def _parse_large(body: bytes) -> tuple[dict[str, Any], str]:
    try:
        return _checked(await load_json(body))
    except orjson.JSONDecodeError:
        raise BadRequest("request body must be a JSON object") from None


def _checked(obj: object) -> tuple[dict[str, Any], str]:
    if not isinstance(obj, dict):
        raise BadRequest("request body must be a JSON object")
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("the 'model' field is required and must be a string")
    stream = obj.get("stream")
    if stream is not None and not isinstance(stream, bool):  # it decides how we answer
        raise BadRequest("the 'stream' field must be true or false")
    return obj, model


def _strip_extensions(obj: dict[str, Any]) -> bool:
    """Remove body fields named `x_*` (runner extensions, never sent to engines)."""
    drop = [k for k in obj if k.startswith("x_")]
    for k in drop:
        del obj[k]
    return bool(drop)


def _estimate_input_tokens(body: bytes) -> int:
    """A cheap estimate until the engine reports real usage: ~4 bytes per token."""
    return max(1, len(body) // 4)


def _estimate_output(obj: dict[str, Any]) -> int:
    for key in ("max_completion_tokens", "max_tokens", "n_predict"):
        v = obj.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 256

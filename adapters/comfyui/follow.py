"""Follow one submitted prompt to its end: the websocket first, `/history` always behind it.

Why both: the websocket gives progress as it happens, but it can drop or go quiet (a known
ComfyUI pain); `/history/{id}` is the authority on how a prompt ended. So:

- while the websocket is up, its events update a `JobView` (`events.fold`); the end marker
  (`executing` with `node: null`, sent after the history entry is written) ends the
  follow, with the outcome read from `/history` (the events' own verdict if history has
  no entry);
- every `safety_poll_s` the history is read anyway, so a websocket that stays open but
  sends nothing cannot hang the job;
- when the websocket is lost, the history is polled every `fallback_poll_s` and the
  websocket reopened (same `clientId`, so ComfyUI sends the prompt's later events to it),
  at most `max_reopen` times;
- a prompt that is neither in history nor in `/queue` was removed by someone else:
  `PromptVanished`;
- **silence**: ComfyUI saying nothing about the prompt for `silence_s`
  (ENGINE_READ_TIMEOUT_S), counted from its submission and from each event about it
  (`events.about`: `progress`, `progress_state`, `executing`, `executed`, ...), ends the
  follow with `EngineSilent` (504 `engine_timeout`) unless `/history` shows it ended
  meanwhile; `run` then removes it from ComfyUI's queue or interrupts it. A sampler sends
  `progress` every step, so only a node that runs that long without a progress hook (or a
  stuck worker), a prompt waiting that long in ComfyUI's own queue, or a websocket lost
  that long, meets it: the same bound as an HTTP engine's silence before its headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from adapters.comfyui.client import (
    SOCKET_ERRORS,
    ComfyUIClient,
    Socket,
    new_client_id,
    new_prompt_id,
)
from adapters.comfyui.errors import PromptVanished
from adapters.comfyui.events import (
    JobView,
    Outcome,
    about,
    fold,
    outcome_from_history,
    parse_message,
)
from adapters.errors import EngineBadResponse, EngineError, EngineSilent
from adapters.trace_context import annotate, current_traceparent

log = logging.getLogger("quorum.comfyui")

OnView = Callable[[JobView], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class FollowTiming:
    safety_poll_s: float = 2.0
    fallback_poll_s: float = 0.25
    reopen_after_s: float = 1.0
    max_reopen: int = 5
    silence_s: float | None = 300.0  # ENGINE_READ_TIMEOUT_S; None: no bound


async def _ignore(_: JobView) -> None:
    return None


Place = Literal["running", "pending"]
"""Where an unfinished prompt is in ComfyUI's `/queue`."""


async def locate(client: ComfyUIClient, prompt_id: str) -> Outcome | Place:
    """The outcome if the prompt ended, else where it waits.

    1. A history entry: its outcome.
    2. In `/queue`: "running" or "pending".
    3. Neither: read the history once more (it may have ended between the two reads);
       still nothing: `PromptVanished`.
    """
    outcome = outcome_from_history(await client.history(prompt_id))  # 1
    if outcome is not None:
        return outcome
    queue = await client.queue()  # 2
    if prompt_id in queue.running:
        return "running"
    if prompt_id in queue.pending:
        return "pending"
    outcome = outcome_from_history(await client.history(prompt_id))  # 3
    if outcome is None:
        raise PromptVanished(
            f"prompt {prompt_id} is neither queued, running nor in ComfyUI's history "
            "(removed by another client, or ComfyUI restarted)"
        )
    return outcome


def silent_past(heard_at: float, now: float, silence_s: float) -> bool:
    """Whether nothing was heard about the prompt for `silence_s` by `now` (pure)."""
    return now - heard_at >= silence_s


def silence(prompt_id: str, place: Place, silence_s: float) -> EngineError:
    """The `EngineSilent` (504) for a prompt ComfyUI said nothing about for `silence_s`
    (pure): what the runner does about it depends on where it is (`run` step 5)."""
    where = (
        "it was running: interrupted"
        if place == "running"
        else "it was still in ComfyUI's queue: removed"
    )
    return EngineSilent(
        f"ComfyUI sent nothing about prompt {prompt_id} for {silence_s:g} s "
        f"(ENGINE_READ_TIMEOUT_S); {where}"
    )


def _silent(prompt_id: str, place: Place, silence_s: float) -> EngineError:
    log.warning("prompt %s: nothing heard for %g s while %s", prompt_id, silence_s, place)
    return silence(prompt_id, place, silence_s)


async def follow(
    client: ComfyUIClient,
    prompt_id: str,
    client_id: str,
    socket: Socket | None,
    on_view: OnView = _ignore,
    timing: FollowTiming = FollowTiming(),
) -> tuple[Outcome, JobView]:
    """Wait until `prompt_id` ends; its outcome and the last view. Closes `socket`.

    Raises `EngineSilent` when ComfyUI said nothing about it for `timing.silence_s`."""
    loop = asyncio.get_running_loop()
    view = JobView()
    reopened = 0
    heard_at = loop.time()  # submitted just now
    quiet_s = timing.silence_s
    next_check = loop.time() + timing.safety_poll_s
    next_reopen = loop.time() + timing.reopen_after_s

    async def ended() -> Outcome | None:
        """The outcome once the prompt ended; raises `EngineSilent` if it has not and
        nothing was heard about it for `quiet_s`."""
        where = await locate(client, prompt_id)
        if isinstance(where, Outcome):
            return where
        if quiet_s is not None and silent_past(heard_at, loop.time(), quiet_s):
            raise _silent(prompt_id, where, quiet_s) from None
        return None

    try:
        while True:
            if socket is None:
                if (outcome := await ended()) is not None:
                    return outcome, view
                if reopened < timing.max_reopen and loop.time() >= next_reopen:
                    reopened += 1
                    next_reopen = loop.time() + timing.reopen_after_s
                    socket = await client.open_socket(client_id)
                    if socket is not None:
                        log.info("prompt %s: websocket reopened", prompt_id)
                        next_check = loop.time()  # it may have ended while we were away
                        continue
                await asyncio.sleep(timing.fallback_poll_s)
                continue
            wake = next_check if quiet_s is None else min(next_check, heard_at + quiet_s)
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a
                # cancellation that lands as recv() completes, and the job runs on.
                async with asyncio.timeout(max(0.0, wake - loop.time())):
                    message = await socket.recv()
            except TimeoutError:
                next_check = loop.time() + timing.safety_poll_s
                if (outcome := await ended()) is not None:
                    return outcome, view
                continue
            except SOCKET_ERRORS as exc:
                log.warning("prompt %s: websocket lost (%s); following /history", prompt_id, exc)
                await _close(socket)
                socket = None
                next_reopen = loop.time() + timing.reopen_after_s
                continue
            event = parse_message(message)
            if event is None:
                continue
            if about(event, prompt_id):
                heard_at = loop.time()
            new = fold(view, event, prompt_id)
            if new == view:
                continue
            view = new
            await on_view(view)
            if view.ended:
                outcome = outcome_from_history(await client.history(prompt_id))
                outcome = outcome or view.outcome()
                if outcome is None:
                    raise EngineBadResponse(
                        f"ComfyUI ended prompt {prompt_id} without a history entry or verdict"
                    )
                return outcome, view
    finally:
        if socket is not None:
            await _close(socket)


async def _close(socket: Socket) -> None:
    with contextlib.suppress(*SOCKET_ERRORS):
        await socket.close()


@dataclass(frozen=True, slots=True)
class Finished:
    """A prompt that ran to its end (whatever the verdict)."""

    prompt_id: str
    outcome: Outcome
    view: JobView
    engine_ms: int


_CLEANUPS: set[asyncio.Task[None]] = set()


async def run(
    client: ComfyUIClient,
    graph: dict[str, object],
    on_view: OnView = _ignore,
    timing: FollowTiming = FollowTiming(),
    prompt_id: str | None = None,
) -> Finished:
    """Submit `graph` and follow it to its end.

    1. Open the event websocket first (a fresh `clientId`), so no early event is missed;
       a websocket that cannot be opened leaves `/history` to do the following.
    2. Submit under `prompt_id`, or one chosen here (ComfyUI's refusals raise from
       `submit`; on a 409 it retries once under another id, which `Finished` carries).
       Traced: the prompt's `extra_data` carries the runner's `traceparent` (ComfyUI has
       no tracing; it shows a prompt's extra data in `/queue` and `/history`), and the
       current span the prompt's id (`quorum.comfyui.prompt_id`).
    3. Follow it (`follow`).
    4. Cancelled at any point after 2 (client gone, job cancelled): the prompt is removed
       from ComfyUI's queue or interrupted (`ComfyUIClient.cancel`), in a task of its own
       so a second cancellation cannot stop the clean-up; then the cancellation goes on.
    5. Silent too long (`EngineSilent` from `follow`): the same clean-up, so ComfyUI is
       free for the next prompt (`POST /queue {delete}` takes a pending prompt out;
       `POST /interrupt {prompt_id}` stops a running one at its next node or progress
       hook; each is a no-op where the other applies); then the 504 goes on.
    """
    loop = asyncio.get_running_loop()
    client_id = new_client_id()
    socket = await client.open_socket(client_id)  # 1
    prompt_id = prompt_id or new_prompt_id()
    started = loop.time()
    try:
        traced = current_traceparent()  # 2
        extra = {"traceparent": traced} if traced else None
        submitted = await client.submit(graph, client_id, prompt_id, extra)
        prompt_id = submitted.prompt_id
        if traced:
            annotate("quorum.comfyui.prompt_id", prompt_id)
        outcome, view = await follow(client, prompt_id, client_id, socket, on_view, timing)  # 3
        socket = None  # follow closed it
    except (asyncio.CancelledError, EngineSilent):  # 4, 5
        task = asyncio.create_task(_cancel_quietly(client, prompt_id))
        _CLEANUPS.add(task)
        task.add_done_callback(_CLEANUPS.discard)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)
        raise
    finally:
        if socket is not None:
            await _close(socket)
    return Finished(prompt_id, outcome, view, round((loop.time() - started) * 1000))


async def _cancel_quietly(client: ComfyUIClient, prompt_id: str) -> None:
    try:
        await client.cancel(prompt_id)
        log.info("prompt %s cancelled at ComfyUI", prompt_id)
    except Exception as exc:
        log.warning("prompt %s: cancelling at ComfyUI failed: %s", prompt_id, exc)

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
  `PromptVanished`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from adapters.comfyui.client import (
    SOCKET_ERRORS,
    ComfyUIClient,
    Socket,
    new_client_id,
    new_prompt_id,
)
from adapters.comfyui.errors import PromptVanished
from adapters.comfyui.events import JobView, Outcome, fold, outcome_from_history, parse_message
from adapters.errors import EngineBadResponse

log = logging.getLogger("quorum.comfyui")

OnView = Callable[[JobView], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class FollowTiming:
    safety_poll_s: float = 2.0
    fallback_poll_s: float = 0.25
    reopen_after_s: float = 1.0
    max_reopen: int = 5


async def _ignore(_: JobView) -> None:
    return None


async def settled(client: ComfyUIClient, prompt_id: str) -> Outcome | None:
    """The outcome if the prompt ended; None while it is queued or running.

    1. A history entry: its outcome.
    2. Still in `/queue` (running or pending): None.
    3. Neither: read the history once more (it may have ended between the two reads);
       still nothing: `PromptVanished`.
    """
    outcome = outcome_from_history(await client.history(prompt_id))  # 1
    if outcome is not None:
        return outcome
    queue = await client.queue()  # 2
    if prompt_id in queue.running or prompt_id in queue.pending:
        return None
    outcome = outcome_from_history(await client.history(prompt_id))  # 3
    if outcome is None:
        raise PromptVanished(
            f"prompt {prompt_id} is neither queued, running nor in ComfyUI's history "
            "(removed by another client, or ComfyUI restarted)"
        )
    return outcome


async def follow(
    client: ComfyUIClient,
    prompt_id: str,
    client_id: str,
    socket: Socket | None,
    on_view: OnView = _ignore,
    timing: FollowTiming = FollowTiming(),
) -> tuple[Outcome, JobView]:
    """Wait until `prompt_id` ends; its outcome and the last view. Closes `socket`."""
    loop = asyncio.get_running_loop()
    view = JobView()
    reopened = 0
    next_check = loop.time() + timing.safety_poll_s
    next_reopen = loop.time() + timing.reopen_after_s
    try:
        while True:
            if socket is None:
                outcome = await settled(client, prompt_id)
                if outcome is not None:
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
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a
                # cancellation that lands as recv() completes, and the job runs on.
                async with asyncio.timeout(max(0.0, next_check - loop.time())):
                    message = await socket.recv()
            except TimeoutError:
                next_check = loop.time() + timing.safety_poll_s
                outcome = await settled(client, prompt_id)
                if outcome is not None:
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
    3. Follow it (`follow`).
    4. Cancelled at any point after 2 (client gone, job cancelled): the prompt is removed
       from ComfyUI's queue or interrupted (`ComfyUIClient.cancel`), in a task of its own
       so a second cancellation cannot stop the clean-up; then the cancellation goes on.
    """
    loop = asyncio.get_running_loop()
    client_id = new_client_id()
    socket = await client.open_socket(client_id)  # 1
    prompt_id = prompt_id or new_prompt_id()
    started = loop.time()
    try:
        submitted = await client.submit(graph, client_id, prompt_id)  # 2
        prompt_id = submitted.prompt_id
        outcome, view = await follow(client, prompt_id, client_id, socket, on_view, timing)  # 3
        socket = None  # follow closed it
    except asyncio.CancelledError:  # 4
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

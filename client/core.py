"""What both pools share and nothing that does I/O: the runners' states, the choice,
and what each answer teaches about a runner. `RunnerPool` and `AsyncRunnerPool`
(client/pool.py) add the HTTP around it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping

from client.errors import NoRunnerAvailable
from client.pick import Choice, left_out, pick
from client.state import (
    RunnerState,
    observe_capabilities,
    observe_failure,
    observe_refusal,
)
from client.steps import Call, NoReply, Reply

CAPABILITIES = "/v1/capabilities"


def normalize(url: str) -> str:
    """A runner's base URL without a trailing slash (`http://` added when no scheme)."""
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"


class PoolCore:
    def __init__(
        self,
        urls: Iterable[str],
        *,
        headers: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        epoch: Callable[[], float] = time.time,
    ) -> None:
        self.clock = clock
        self.epoch = epoch
        self.headers = dict(headers or {})
        self._states = {u: RunnerState(u) for u in dict.fromkeys(normalize(u) for u in urls)}
        if not self._states:
            raise ValueError("a pool needs at least one runner URL")

    @property
    def urls(self) -> list[str]:
        return list(self._states)

    def states(self) -> list[RunnerState]:
        """Every runner as last seen, in the order given."""
        return list(self._states.values())

    def state(self, url: str) -> RunnerState:
        return self._states[normalize(url)]

    def due(self, force: bool = False) -> list[Call]:
        """Capabilities calls for the runners whose cache has expired (all with `force`)."""
        now = self.clock()
        return [
            Call("GET", url + CAPABILITIES, headers=self.headers)
            for url, state in self._states.items()
            if force or state.due(now)
        ]

    def record(self, url: str, outcome: Reply | NoReply) -> RunnerState:
        """What a capabilities call answered (or that nothing did)."""
        url = _base(url)
        now = self.clock()
        state = self._states[url]
        if isinstance(outcome, NoReply):
            state = observe_failure(state, outcome.reason, now)
        else:
            state = observe_capabilities(
                state, outcome.status, outcome.headers, outcome.json(), now
            )
        self._states[url] = state
        return state

    def choose(
        self, model: str, priority: str = "normal", exclude: Collection[str] = ()
    ) -> Choice | None:
        return pick(model, self.states(), self.clock(), priority=priority, exclude=exclude)

    def choose_or_raise(self, model: str, priority: str = "normal") -> Choice:
        choice = self.choose(model, priority)
        if choice is None:
            raise NoRunnerAvailable(model, left_out(model, self.states()))
        return choice

    def mark_unreachable(self, url: str, reason: str) -> None:
        self._states[url] = observe_failure(self._states[url], reason, self.clock())

    def mark_refused(self, url: str, retry_after_s: float | None) -> None:
        self._states[url] = observe_refusal(self._states[url], retry_after_s, self.clock())

    def by_runner_id(self, runner_id: str) -> str | None:
        """The URL of the runner whose capabilities name `runner_id` (a token's `aud`)."""
        for url, state in self._states.items():
            if state.view is not None and state.view.runner_id == runner_id:
                return url
        return None


def _base(url: str) -> str:
    return url[: -len(CAPABILITIES)] if url.endswith(CAPABILITIES) else url

"""A pool of runners without the I/O: who asks, what is known of each runner, the choice,
and the flows that keep that knowledge fresh (`refresh`) and choose (`pick`).

`RunnerPool` and `AsyncRunnerPool` (client/facades.py) are this class with a driver;
`client/inference.py` and `client/lifecycle.py` hold the pool's other flows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from typing import TypedDict

from client.errors import ClientError, NoRunnerAvailable
from client.pick import Choice, left_out
from client.pick import pick as choose
from client.state import (
    RunnerState,
    observe_capabilities,
    observe_failure,
    observe_refusal,
)
from client.steps import Call, Calls, Flow, NoReply, Reply
from client.tokens import OpToken

CAPABILITIES = "/v1/capabilities"
DEFAULT_DEADLINE_S = 30.0
POLL_TIMEOUT_S = 5.0
"""A runner that takes longer than this (`poll_timeout_s`) to answer capabilities counts as
unreachable: as long as the contract's polling period, so a busy runner is not dropped."""


def normalize(url: str) -> str:
    """A runner's base URL without a trailing slash (`http://` added when no scheme)."""
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"


def identity_headers(tenant: str | None, api_key: str | None) -> dict[str, str]:
    """How the runner knows who asks: X-Tenant-ID, and the tenant's API key if keys are on."""
    headers = {}
    if tenant:
        headers["X-Tenant-ID"] = tenant
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


class PoolOptions(TypedDict, total=False):
    """`PoolCore`'s keyword arguments, for the façades that pass them on."""

    tenant: str | None
    api_key: str | None
    priority: str
    deadline_s: float
    poll_timeout_s: float
    clock: Callable[[], float]
    epoch: Callable[[], float]


class PoolCore:
    """Several runners as one, as data: their states in the order given, and the pool's
    defaults for who asks (`tenant`, `api_key`), `priority` and `deadline_s`."""

    def __init__(
        self,
        urls: Iterable[str],
        *,
        tenant: str | None = None,
        api_key: str | None = None,
        priority: str = "normal",
        deadline_s: float = DEFAULT_DEADLINE_S,
        poll_timeout_s: float = POLL_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        epoch: Callable[[], float] = time.time,
    ) -> None:
        self.tenant = tenant
        self.api_key = api_key
        self.priority = priority
        self.deadline_s = deadline_s
        self.poll_timeout_s = poll_timeout_s
        self.clock = clock
        self.epoch = epoch
        self.headers = identity_headers(tenant, api_key)
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
            Call("GET", url + CAPABILITIES, headers=self.headers, timeout_s=self.poll_timeout_s)
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
        return choose(model, self.states(), self.clock(), priority=priority, exclude=exclude)

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

    def target(self, token: OpToken, url: str | None) -> str:
        """Where a lifecycle operation goes: `url`, else the runner the token names (aud)."""
        if url is not None:
            return url.rstrip("/")
        if len(self._states) == 1:
            return self.urls[0]
        found = self.by_runner_id(token.aud) if token.aud else None
        if found is None:
            raise ClientError(
                f"the token is addressed to runner {token.aud!r}, which no runner of this "
                "pool reports as its runnerId; pass url="
            )
        return found


def refresh(pool: PoolCore, force: bool = False) -> Flow[list[RunnerState]]:
    """Poll the runners whose capabilities cache expired (every runner with `force`), all
    at once; return every runner's state."""
    calls = pool.due(force)
    if calls:
        outcomes = yield Calls(tuple(calls))
        assert isinstance(outcomes, tuple)
        for call, outcome in zip(calls, outcomes, strict=True):
            pool.record(call.url, outcome)
    return pool.states()


def pick(pool: PoolCore, model: str, priority: str | None = None) -> Flow[Choice]:
    """The best runner for `model` now (NoRunnerAvailable if none); `choice.reason` says why."""
    yield from refresh(pool)
    return pool.choose_or_raise(model, priority or pool.priority)


def _base(url: str) -> str:
    return url[: -len(CAPABILITIES)] if url.endswith(CAPABILITIES) else url

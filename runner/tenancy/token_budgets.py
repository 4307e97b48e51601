"""Token budgets on the data path: reserve a request's bounds (runner/tenancy/guard.py)
before it queues, waiting in line for requests in flight to settle when only their
reservations stand in the way, and settle to what it was charged when it ends
(tenants/budgets.py is the accounting, tenants/budget_waits.py the decision to wait,
runner/tenancy/budget_queue.py the line).

Cost per request: the policy's budgets that apply to a (tenant, model) are worked out once
per policy (`tenants.budgets.Plans`); with the counters in this process (the embedded
default) reserving and settling are plain calls, no coroutine or task; only a store
across the network (Redis) is awaited to reserve and settled in the background.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from runner.tenancy.budget_queue import RANKS, BudgetLine
from runner.tenancy.guard import Headers, duration, reset_text
from tenants.budget_store import BudgetStore, BudgetStoreUnavailable
from tenants.budget_waits import WaitInLine, after_refusal, counted_bound
from tenants.budgets import Charge, Plans, Reservation, ReserveAttempt, Settlement, settle
from tenants.config import TenantPolicy
from tenants.errors import RequestExceedsBudget, TokenBudgetExceeded, TokenBudgetUnavailable
from tenants.policy import TokenBudget

log = logging.getLogger("quorum.tenancy.budgets")


@dataclass(slots=True)
class Held:
    """A request's reservation, until it is settled."""

    reservation: Reservation
    input_bound: int
    output_bound: int
    settled: bool = False


class Budgets:
    """Reserve and settle token budgets (`BudgetStore`: memory or Redis).

    A reservation that does not fit only because requests in flight have not settled
    waits for them, in line (runner/tenancy/budget_queue.py), within its bound; a
    refusal means the spent tokens leave no room, or the bound ran out
    (tenants/budget_waits.py).

    With the store unreachable: refused with 503 `token_budget_unavailable` (a budget is
    a spending limit: failing open could overshoot), or allowed without a reservation
    when `fail_open` (TOKEN_BUDGET_FAIL_OPEN)."""

    POLL_S = (0.02, 0.2)
    """With the counters in another process: the first in line polls them this often,
    doubling while nothing changes (another replica's settlements are seen there)."""

    def __init__(
        self,
        store: BudgetStore,
        *,
        clock: Callable[[], float] = time.time,
        fail_open: bool = False,
        wait_s: float = 0.0,
    ) -> None:
        """`wait_s`: how long a request may wait in line, at most (TOKEN_BUDGET_WAIT_MS)."""
        self.store = store
        self.wait_s = wait_s
        self._book = store.book  # the counters, when in this process: called directly
        self._clock = clock
        self.fail_open = fail_open
        self._plans = Plans()
        self._settling: set[asyncio.Task[None]] = set()
        self.line = BudgetLine(None if self._book is not None else self.POLL_S)

    async def reserve(
        self,
        tenant: str,
        policy: TenantPolicy,
        model: str,
        input_bound: int,
        output_bound: int,
        *,
        priority: str = "normal",
        wait_s: float = 0.0,
        on_wait: Callable[[], None] | None = None,
        count: Callable[[], Awaitable[int | None]] | None = None,
    ) -> tuple[Held | None, Headers]:
        """Reserve the request's bounds against every budget of `policy` that applies,
        waiting at most `wait_s` for requests in flight to settle (`on_wait()` first).
        `count()`: the engine's count of the prompt (adapters/prompt_tokens.py), asked at
        most once, only where the byte bound would make the request wait or be refused.

        1. No budget applies: nothing (no store call, no headers).
        2. A charge larger than its whole budget: the prompt counted
           (`budget_waits.counted_bound`) and planned again; still larger: 400
           `request_exceeds_budget`.
        3. Others of its priority or above wait for one of its counters: counted, it
           joins them. Else all charges at once (`BudgetStore.reserve`); refused, counted
           and tried again once with the count; the store unreachable: 503, or nothing
           when failing open.
        4. A budget that has no room: `budget_waits.after_refusal` decides. Refused: 429
           `token_budget_exceeded` naming it, with `Retry-After` and the tokens headers;
           else it waits in line (`_wait`) and tries again.
        5. Reserved: the hold (with the bound reserved: the count, where counted), and
           the tokens headers of the tightest budget.
        """
        if not policy.token_budgets:  # 1
            return None, []
        now = self._clock()
        plan = functools.partial(self._plans.plan, tenant, policy.token_budgets, model)
        charges = plan(input_bound, output_bound, now)
        if not charges:
            return None, []
        if count is not None and any(c.amount > c.budget.tokens for c in charges):  # 2
            input_bound = counted_bound(input_bound, await count())
            count, charges = None, plan(input_bound, output_bound, now)
        self._whole(tenant, charges)
        rank = RANKS.get(priority, 1)
        key = self.line.ahead([c.key for c in charges], rank) if self.line.waiting else None
        attempt = None
        if key is None:  # 3
            attempt = await self._attempt(tenant, charges, now)
            if attempt is not None and attempt.refused and count is not None:
                counted = counted_bound(input_bound, await count())
                if counted != input_bound:
                    input_bound, now = counted, self._clock()
                    charges = plan(input_bound, output_bound, now)
                    self._whole(tenant, charges)
                    attempt = await self._attempt(tenant, charges, now)
            if attempt is None:
                return None, []
            if not attempt.refused:  # 5
                reservation = Reservation(tenant, tuple(charges), attempt.counters)
                return Held(reservation, input_bound, output_bound), self.headers(reservation, now)
            key = charges[attempt.refused - 1].key
        elif count is not None:
            input_bound = counted_bound(input_bound, await count())
            now = self._clock()
            charges = plan(input_bound, output_bound, now)
            self._whole(tenant, charges)
        args = (tenant, policy.token_budgets, model, input_bound, output_bound)  # 4
        give_up_at = now + max(0.0, wait_s)
        return await self._wait(args, charges, attempt, key, rank, now, give_up_at, on_wait)

    @staticmethod
    def _whole(tenant: str, charges: list[Charge]) -> None:
        """Step 2: 400 `request_exceeds_budget` for a charge larger than its whole budget."""
        for charge in charges:
            if charge.amount > charge.budget.tokens:
                raise RequestExceedsBudget(
                    tenant=tenant,
                    budget_text=charge.budget.text,
                    budget=charge.budget.to_json(),
                    requested=charge.amount,
                )

    async def _wait(
        self,
        args: tuple[str, tuple[TokenBudget, ...], str, int, int],
        charges: list[Charge],
        attempt: ReserveAttempt | None,
        key: str,
        rank: int,
        since: float,
        give_up_at: float,
        on_wait: Callable[[], None] | None,
    ) -> tuple[Held | None, Headers]:
        """Step 4: in line for counter `key` (the refused one, or the one others wait
        for, for a request that joined without trying) until reserved or refused; the
        window planned afresh at every try (a new window has the whole budget)."""
        now = since
        until = give_up_at
        if attempt is not None:
            until = self._decide(args[0], charges, attempt, now, give_up_at, since)
        if on_wait is not None:
            on_wait()
        ticket = self.line.join(key, rank)
        try:
            while True:
                await self.line.turn(ticket, until - self._clock())
                now = self._clock()
                charges = self._plans.plan(*args, now)
                attempt = await self._attempt(args[0], charges, now, shielded=True)
                if attempt is None:
                    return None, []
                if not attempt.refused:
                    reservation = Reservation(args[0], tuple(charges), attempt.counters)
                    held = Held(reservation, args[3], args[4])
                    return held, self.headers(reservation, now, waited_s=now - since)
                until = self._decide(args[0], charges, attempt, now, give_up_at, since)
                self.line.move(ticket, charges[attempt.refused - 1].key)
        finally:
            self.line.leave(ticket)

    def _decide(
        self,
        tenant: str,
        charges: list[Charge],
        attempt: ReserveAttempt,
        now: float,
        give_up_at: float,
        since: float,
    ) -> float:
        """`after_refusal` committed: the time to wait until, or the 429 raised."""
        i = attempt.refused - 1
        charge, counter = charges[i], attempt.counters[i]
        decision = after_refusal(charge, counter, attempt.held, now, give_up_at, now - since)
        if isinstance(decision, WaitInLine):
            return decision.until
        wait = decision.retry_after_s
        raise TokenBudgetExceeded(
            tenant=tenant,
            budget_text=charge.budget.text,
            budget=charge.budget.to_json(),
            remaining=max(0, charge.limit - counter),
            requested=charge.amount,
            resetAt=charge.window_end,
            retry_after=wait,
            limit=charge.limit,
            reset=duration(charge.window_end - now),
        )

    async def _attempt(
        self, tenant: str, charges: list[Charge], now: float, *, shielded: bool = False
    ) -> ReserveAttempt | None:
        """One try at the store (None: unreachable, failing open). Across the network,
        `shielded` (a waiter, whose client is watched): a request cancelled meanwhile
        (its client gone) gives back what the call reserved once it answers."""
        if self._book is not None:  # in this process, one plain call
            return self._book.reserve(charges, now)
        call = self.store.reserve(charges, now)
        if not shielded:  # the first try: nothing cancels it but the runner's shutdown
            try:
                return await call
            except BudgetStoreUnavailable as exc:
                self._unavailable(exc)
                return None
        task = asyncio.ensure_future(call)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(functools.partial(self._orphan, tenant, charges))
            raise
        except BudgetStoreUnavailable as exc:
            self._unavailable(exc)
            return None

    def _unavailable(self, exc: BudgetStoreUnavailable) -> None:
        """The store unreachable: logged, and 503 unless failing open (then the caller
        goes on without a reservation)."""
        log.error("token budget store unreachable: %s", exc)
        if not self.fail_open:
            raise TokenBudgetUnavailable(retry_after=1) from None

    def _orphan(
        self, tenant: str, charges: list[Charge], call: asyncio.Future[ReserveAttempt]
    ) -> None:
        """A reservation whose request was cancelled while the store answered: released."""
        if call.cancelled() or call.exception() is not None or call.result().refused:
            return
        reservation = Reservation(tenant, tuple(charges), ())
        self.settle(Held(reservation, 0, 0), 0, 0)

    @staticmethod
    def headers(reservation: Reservation, now: float, waited_s: float = 0.0) -> Headers:
        """The tokens trio of the budget with the fewest tokens left (ties: the soonest
        reset); `x-budget-wait-ms` after a wait in line."""
        charges, counters = reservation.charges, reservation.counters
        charge, left = charges[0], charges[0].budget.tokens - counters[0]
        for i in range(1, len(charges)):
            other = charges[i]
            other_left = other.budget.tokens - counters[i]
            if other_left < left or (other_left == left and other.window_end < charge.window_end):
                charge, left = other, other_left
        headers = [
            (b"x-ratelimit-limit-tokens", b"%d" % charge.budget.tokens),
            (b"x-ratelimit-remaining-tokens", b"%d" % max(0, left)),
            (b"x-ratelimit-reset-tokens", reset_text(math.ceil(charge.window_end - now))),
        ]
        if waited_s > 0:
            headers.append((b"x-budget-wait-ms", b"%d" % round(waited_s * 1000)))
        return headers

    def settle(self, held: Held | None, used_in: int, used_out: int) -> None:
        """Replace the reservation by what the request used, once per hold: at once with
        the counters in this process, else in the background (the answer never waits)."""
        if held is None or held.settled:
            return
        held.settled = True
        if used_in > held.input_bound or used_out > held.output_bound:
            log.warning(
                "tenant %s used %d/%d tokens above its reserved bound %d/%d",
                held.reservation.tenant,
                used_in,
                used_out,
                held.input_bound,
                held.output_bound,
            )
        settlements = settle(held.reservation, used_in, used_out)
        if not settlements:
            return
        if self._book is not None:
            self._book.adjust(settlements, self._clock())
            if self.line.waiting:
                self.line.settled([key for key, _, _ in settlements])
            return
        task = asyncio.get_running_loop().create_task(self._adjust(settlements))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    RELEASE_RETRIES_S: tuple[float, ...] = (0.5, 2.0, 8.0)
    """After a settlement lost to the store: when its held part is released again."""

    async def _adjust(self, settlements: list[Settlement]) -> None:
        """A settlement, in the background. Lost to the store (it may or may not have
        been applied), the counter's part is never sent again (twice would under-count:
        an overshoot) and stays charged at the bound; its held part is released again,
        alone, after `RELEASE_RETRIES_S`: released twice, a waiter takes tokens still
        held for spent and is refused sooner, never admitted beyond the budget, while
        never released, every waiter of the window would wait out its bound."""
        try:
            await self.store.adjust(settlements, self._clock())
        except BudgetStoreUnavailable as exc:
            log.warning("a token budget settlement was lost (%s); the bound stays charged", exc)
            releases = [(key, 0, released) for key, _, released in settlements if released]
            for delay in self.RELEASE_RETRIES_S:
                await asyncio.sleep(delay)
                try:
                    await self.store.adjust(releases, self._clock())
                    break
                except BudgetStoreUnavailable:
                    continue
            else:
                return
        if self.line.waiting:
            self.line.settled([key for key, _, _ in settlements])

    async def idle(self) -> None:
        """Wait for the settlements under way (tests, shutdown)."""
        while self._settling:
            await asyncio.gather(*list(self._settling), return_exceptions=True)

"""What a pool knows about one runner, and how each observation changes it (pure).

A `RunnerState` is immutable; `observe_capabilities`, `observe_failure` and
`observe_refusal` return the next one. Times are the pool's clock (monotonic seconds),
passed in. The last good capabilities view is kept through failures, with its age, so a
caller can still see what a runner served before it went quiet.

    reach        capabilities answered            pick uses it
    ---------    -----------------------------    ------------
    unknown      never polled yet                 no
    up           200 with a document              yes
    starting     503, health "starting"           no
    stopping     503, health "stopping"           no
    unavailable  any other error status           no
    unreachable  no answer (refused, timeout)     no
"""

from __future__ import annotations

import contextlib
import email.utils
import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from client.capabilities import Capabilities, parse_capabilities

DEFAULT_MAX_AGE_S = 5.0
"""The contract's capabilities cache: 5 s (the runner also says so in Cache-Control)."""

_MAX_AGE = re.compile(r"(?:^|,)\s*max-age\s*=\s*(\d+)", re.IGNORECASE)


class Reach(enum.Enum):
    UNKNOWN = "unknown"
    UP = "up"
    STARTING = "starting"
    STOPPING = "stopping"
    UNAVAILABLE = "unavailable"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True, slots=True)
class RunnerState:
    url: str
    reach: Reach = Reach.UNKNOWN
    view: Capabilities | None = None
    """The last good capabilities view (kept when the runner later fails)."""
    seen_at: float | None = None
    """When `view` was fetched."""
    polled_at: float | None = None
    """When the runner was last asked, whatever it answered."""
    max_age_s: float = DEFAULT_MAX_AGE_S
    error: str | None = None
    """Why the runner is not `up`, in words."""
    busy_until: float | None = None
    """The runner asked clients to wait (Retry-After on a 429 or 503) until then."""

    def age(self, now: float) -> float | None:
        """Seconds since the last good view; None if there never was one."""
        return None if self.seen_at is None else max(0.0, now - self.seen_at)

    def due(self, now: float) -> bool:
        """The cache has expired: ask again (never more often than the runner allows)."""
        return self.polled_at is None or now - self.polled_at >= self.max_age_s

    def retry_after_s(self, now: float) -> float:
        """What is left of the last Retry-After this runner sent (0 when none)."""
        return 0.0 if self.busy_until is None else max(0.0, self.busy_until - now)


def max_age(cache_control: str | None) -> float | None:
    """`max-age` of a Cache-Control header in seconds, or None."""
    found = _MAX_AGE.search(cache_control or "")
    return float(found.group(1)) if found else None


def parse_retry_after(value: str | None, now_epoch: float) -> float | None:
    """Retry-After in seconds from now: delta-seconds or an HTTP date; None if absent or bad."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now_epoch)


def observe_capabilities(
    state: RunnerState,
    status: int,
    headers: Mapping[str, str],
    body: object,
    now: float,
) -> RunnerState:
    """The state after a capabilities answer.

    1. The cache lifetime is the runner's Cache-Control max-age (else 5 s).
    2. 200 with a valid document: `up`, the view replaced, the error cleared.
    3. 503 with a document whose health is `starting` or `stopping`: that reach;
       the view is kept as it was (a stopping runner's models are leaving).
    4. Anything else (another status, a body that is no document): `unavailable`,
       with the status and the runner's message.
    """
    ttl = max_age(headers.get("cache-control"))  # 1
    polled = replace(state, polled_at=now, max_age_s=ttl if ttl is not None else DEFAULT_MAX_AGE_S)
    view: Capabilities | None = None
    with contextlib.suppress(ValueError):
        view = parse_capabilities(body)
    if status == 200 and view is not None:  # 2
        return replace(polled, reach=Reach.UP, view=view, seen_at=now, error=None)
    if status == 503 and view is not None and view.health in ("starting", "stopping"):  # 3
        reach = Reach.STARTING if view.health == "starting" else Reach.STOPPING
        return replace(polled, reach=reach, error=f"runner is {view.health}")
    return replace(  # 4
        polled, reach=Reach.UNAVAILABLE, error=f"capabilities answered {status}{_message(body)}"
    )


def observe_failure(state: RunnerState, reason: str, now: float) -> RunnerState:
    """No answer at all: `unreachable`; the last good view stays, ageing."""
    return replace(state, reach=Reach.UNREACHABLE, polled_at=now, error=reason)


def observe_refusal(state: RunnerState, retry_after_s: float | None, now: float) -> RunnerState:
    """A 429 or 503 on a request: remember until when the runner asked us to stay away."""
    if retry_after_s is None:
        return state
    return replace(state, busy_until=now + retry_after_s)


def _message(body: object) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return f": {error['message']}"
    return ""

"""The client's exceptions, one tree; httpx's are translated once, in `client/transport.py`.

    ClientError
    ├── RunnerUnreachable      no HTTP answer (connection refused or reset, timeout): .url
    ├── RunnerRefused          an HTTP error answer: .url .status .code .message .retry_after
    ├── NoRunnerAvailable      `pick` found no runner for the model: .model .excluded
    ├── DeadlineExceeded       every runner refused and waiting for the next Retry-After
    │                          would pass the deadline: .attempts .last (the last refusal)
    ├── LoadFailed             a load task ended `failed`: .task_id .model_id .error
    │   └── LoadCancelled      ... ended `cancelled` (through this client or anyone else)
    ├── LoadTimedOut           the caller's timeout passed while following a load (it goes on)
    └── BadToken               a token file holds no op token whose claims can be read

Every error that came from a runner carries the URL it asked (`.url`), so a caller with
several runners knows which one said what.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


class ClientError(Exception):
    """Everything the client raises."""


class RunnerUnreachable(ClientError):
    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: no answer ({reason})")
        self.url = url
        self.reason = reason


class RunnerRefused(ClientError):
    """The runner answered with an HTTP error in its envelope `{"error": {code, message}}`."""

    def __init__(
        self,
        url: str,
        status: int,
        code: str,
        message: str,
        *,
        retry_after: float | None = None,
        body: object = None,
    ) -> None:
        super().__init__(f"{url}: {status} {code}: {message}")
        self.url = url
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.body = body


class NoRunnerAvailable(ClientError):
    def __init__(self, model: str, excluded: Mapping[str, str]) -> None:
        why = "; ".join(f"{url}: {reason}" for url, reason in excluded.items()) or "no runners"
        super().__init__(f"no runner can serve {model!r} ({why})")
        self.model = model
        self.excluded = dict(excluded)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try of a request: where it went and what came back (status, or the failure)."""

    url: str
    status: int | None
    code: str | None = None
    retry_after: float | None = None


class DeadlineExceeded(ClientError):
    def __init__(self, model: str, attempts: Sequence[Attempt], last: ClientError | None) -> None:
        super().__init__(
            f"{model!r}: no runner answered within the deadline after {len(attempts)} "
            f"attempt(s); last: {last}"
        )
        self.model = model
        self.attempts = list(attempts)
        self.last = last


class LoadFailed(ClientError):
    def __init__(self, url: str, task_id: str, model_id: str, error: str) -> None:
        super().__init__(f"{url}: load of {model_id!r} ({task_id}) {self._verb}: {error}")
        self.url = url
        self.task_id = task_id
        self.model_id = model_id
        self.error = error

    _verb = "failed"


class LoadCancelled(LoadFailed):
    _verb = "was cancelled"


class LoadTimedOut(ClientError):
    def __init__(self, url: str, task_id: str, timeout_s: float) -> None:
        super().__init__(
            f"{url}: load task {task_id} still running after {timeout_s:g} s; "
            "it goes on at the runner"
        )
        self.url = url
        self.task_id = task_id


class BadToken(ClientError):
    """The token cannot be read (not JSON, not an op token, unreadable claims)."""

"""A client for Quorum runners, for the router that routes to them (Protocol.Inference) and
for the people who run them.

It speaks HTTP only (httpx) and imports nothing of the runner's own packages: what it knows
of a runner is what the runner answers (docs/client.md).

- `RunnerPool` / `AsyncRunnerPool`: several runners; capabilities polled within their
  5 s cache; `pick(model)` with its reason; inference helpers that fall over; loads.
- `Runner` / `AsyncRunner`: one runner's documents and governed operations.
  Each pair is one set of flows (`client/steps.py`) behind a blocking and an async
  façade (`client/facades.py`).
- `read_token` / `parse_token`: an op token to carry (signing stays with `quorum token`).
- `client/errors.py`: every exception, in one tree.
"""

from client.capabilities import Capabilities, parse_capabilities
from client.errors import (
    Attempt,
    BadToken,
    ClientError,
    DeadlineExceeded,
    LoadCancelled,
    LoadFailed,
    LoadTimedOut,
    NoRunnerAvailable,
    RunnerRefused,
    RunnerUnreachable,
)
from client.facades import AsyncRunner, AsyncRunnerPool, Runner, RunnerPool
from client.inference import Answer
from client.lifecycle import LoadProgress, LoadResult
from client.pick import Candidate, Choice, pick
from client.state import Reach, RunnerState
from client.tokens import OpToken, parse_token, read_token

__all__ = [
    "Answer",
    "AsyncRunner",
    "AsyncRunnerPool",
    "Attempt",
    "BadToken",
    "Candidate",
    "Capabilities",
    "Choice",
    "ClientError",
    "DeadlineExceeded",
    "LoadCancelled",
    "LoadFailed",
    "LoadProgress",
    "LoadResult",
    "LoadTimedOut",
    "NoRunnerAvailable",
    "OpToken",
    "Reach",
    "Runner",
    "RunnerPool",
    "RunnerRefused",
    "RunnerState",
    "RunnerUnreachable",
    "parse_capabilities",
    "parse_token",
    "pick",
    "read_token",
]
